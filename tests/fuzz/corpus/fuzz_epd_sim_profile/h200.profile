# NVIDIA H200 SXM, one device.  Approximate; from NVIDIA's public H200 spec
# sheet (nvidia.com/en-us/data-center/h200): 141 GB HBM3e, 4.8 TB/s memory
# bandwidth, 1,979 TFLOPS BF16 Tensor Core *with sparsity*, i.e. ~989 TFLOPS
# dense.  Sustained figures are those peaks times an efficiency chosen here
# (not measured): 60% of dense BF16 for large GEMMs, 85% of HBM bandwidth
# for streaming reads.  W8A8 / FP8 GEMMs would run up to 2x faster on
# compute; the model does not credit that (conservative for compute-bound
# prefill).
name = h200
flops = 5.94e14      # 989.4e12 dense BF16 x 0.60
mem_bw = 4.08e12     # 4.8e12 x 0.85
hbm_bytes = 141e9
