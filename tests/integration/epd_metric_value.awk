# epd_metric_value.awk — `awk -v s=SERIES -f epd_metric_value.awk`: on
# stdin a Prometheus text (/metrics), on stdout the value of SERIES, e.g.
# 'epd_router_worker_requests_total{worker="decode-0",pool="decode"}'
# (nothing when absent).  Used by router_metric (lib.sh) and mh_metric
# (tests/multihost/lib.sh).
#
# A sample's series is its line without the last field (the value; the
# router prints no timestamps).  Every router series carries model="..."
# first; a SERIES without a model label is compared with the model label
# taken out ({model="m",a="b"} -> {a="b"}, {model="m"} -> no braces), so
# callers name series as before and a wrong value still fails them.  A
# SERIES with model= must match exactly.
/^#/ || NF < 2 { next }
{
  v = $NF
  k = substr($0, 1, length($0) - length(v) - 1)
  if (k == s) { print v; next }
  if (index(s, "model=") == 0) {
    if (sub(/[{]model="([^"\\]|\\.)*"[}]/, "", k) == 0)
      sub(/[{]model="([^"\\]|\\.)*",/, "{", k)
    if (k == s) print v
  }
}
