# A dense 70B-class model with grouped-query attention, shaped like Llama 3
# 70B (public config.json of meta-llama/Meta-Llama-3.1-70B: 80 layers,
# hidden 8192, 64 heads, 8 KV heads of 128, vocab 128256, 128K context,
# ~70.6B parameters), BF16 weights and KV.  Approximate.
name = dense-70b
n_layers = 80
layer_pattern = A
hidden = 8192
n_heads = 64
n_kv_heads = 8
head_dim = 128
kv_dtype = BF16               # 2 x 8 x 128 x 2 B = 4 KiB per token per layer
state_bytes = 0
active_params = 70.6e9
total_params = 70.6e9
weight_bytes = 2              # BF16
vocab = 128256
max_context = 131072
