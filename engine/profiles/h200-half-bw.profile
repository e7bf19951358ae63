# A hypothetical accelerator with an H200's compute but half its memory
# bandwidth and half its capacity: the "less on-chip memory and
# interconnect bandwidth than mainstream GPUs" case of the production
# report (docs/design/architecture.md).  Derived from h200.profile; approximate.
name = h200-half-bw
flops = 5.94e14      # as h200: 989.4e12 dense BF16 x 0.60
mem_bw = 2.04e12     # h200's 4.08e12 / 2
hbm_bytes = 70.5e9   # h200's 141e9 / 2
