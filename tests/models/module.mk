# tests/models: the engine's Hugging Face architectures (Llama-3, Qwen2,
# Qwen3, Qwen3-MoE) against an independent float64 forward pass in numpy
# (hf_ref.py, written from transformers' modeling code; hf_check.py
# compares, hf_write.py writes a second kind of folder).
ALL_TESTS += tests/models/test_hf_logits.sh
