#!/usr/bin/env python3
"""epd_dashboard_names.py DASHBOARD.json NAMES: every PromQL query of the
Grafana dashboard names at least one epd_* metric, every epd_* name a
query uses is in NAMES (one per line: the sample and family names a live
cluster's /metrics served), and every selector filters {model=~"$model"}
first (every series of every daemon carries the model label).  Prints each query's names; exit 1 on a miss.
"""
import json
import re
import sys


def exprs(node, out):
    """Every "expr" string anywhere in the dashboard (panels, rows, targets)."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "expr" and isinstance(v, str):
                out.append(v)
            else:
                exprs(v, out)
    elif isinstance(node, list):
        for v in node:
            exprs(v, out)
    return out


def main():
    dash = json.load(open(sys.argv[1]))
    names = set(l.strip() for l in open(sys.argv[2]) if l.strip())
    queries = exprs(dash, [])
    if not queries:
        print("the dashboard has no queries")
        return 1
    bad = 0
    for q in queries:
        # identifiers outside label matchers ({...}) and strings
        bare = re.sub(r'\{[^}]*\}', '', q)
        bare = re.sub(r'"[^"]*"', '', bare)
        used = sorted(set(re.findall(r'\bepd_[a-zA-Z0-9_:]+', bare)))
        if not used:
            print("FAIL: a query names no epd_ metric: %s" % q)
            bad += 1
            continue
        missing = [n for n in used if n not in names]
        if missing:
            print("FAIL: %s: not served: %s" % (q, ", ".join(missing)))
            bad += 1
            continue
        # every daemon labels every series model="..." (docs/metrics.md):
        # each selector filters by the dashboard's model variable
        unfiltered = [m.group(1) for m in re.finditer(r'\b(epd_[a-zA-Z0-9_:]+)(\{[^}]*\})?', q)
                      if not (m.group(2) or "").startswith('{model=~"$model"')]
        if unfiltered:
            print('FAIL: %s: not filtered by {model=~"$model"}: %s' % (q, ", ".join(unfiltered)))
            bad += 1
    print("dashboard: %d queries, %d with a metric nobody serves or not filtered by model"
          % (len(queries), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
