# tests/models: the engine's Hugging Face architectures (Llama-3, Qwen2,
# Qwen3, Qwen3-MoE) against an independent float64 forward pass in numpy
# (hf_ref.py, written from transformers' modeling code; hf_check.py
# compares; hf_write.py writes a second kind of folder beside
# epd-mkmodel's).  183 epd-generate runs, each a 151k-wide lm_head row per
# position: 3.5-7 min here at load average 8-13 (1.5-2 min of CPU); under
# ASan/UBSan 13.5 min (4.5 min of CPU, epd-generate 239 s of it), so in
# the gcc pass only, like tests/tokenizer; the engine's memory safety under
# the sanitizers is its unit tests' (this test passed once under them by
# hand: 183 passed, 0 failed, no sanitizer report).
ifeq ($(SANITIZER),)
ALL_TESTS += tests/models/test_hf_logits.sh
endif
