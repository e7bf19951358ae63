# A hybrid MoE model shaped like the production one in docs/design/architecture.md:
# about 320B total / 18B active parameters, W8A8 weights, mostly linear
# attention with a quarter of full (grouped-query) attention layers, 1M-token
# context.  The report gives only the totals; the shape below is an
# assumption chosen to be plausible next to public hybrid models (e.g.
# MiniMax-01's linear/softmax mix, Qwen3-Next's 3:1 linear-to-full ratio
# and 128x128 per-head linear-attention states).  Approximate.
name = hybrid-moe-320b
n_layers = 64
layer_pattern = LLLA          # 48 linear, 16 full attention layers
hidden = 6144
n_heads = 64                  # query heads of a full attention layer
n_kv_heads = 4                # GQA: 16 query heads per KV head
head_dim = 128
kv_dtype = BF16               # 2 x 4 x 128 x 2 B = 2 KiB per token per attention layer
state_bytes = 2097152         # 32 heads x 128 x 128 x f32 per linear layer per request
active_params = 18e9
total_params = 320e9
weight_bytes = 1              # W8A8
vocab = 151936
max_context = 1048576
