#!/usr/bin/env bash
# deploy/k8s, offline: every overlay rendered (tests/deploy/epd_k8s_render.mjs,
# kustomize's subset; compared object for object with a real `kustomize
# build` / `kubectl kustomize` when one is installed), validated against
# the Kubernetes schemas (npm kubernetes-models; KEDA's ScaledObject with
# @kubernetes-models/keda) plus unknown fields, and cross-checked
# (tests/deploy/epd_k8s_check.mjs: flags in the binaries' --help, probe
# ports, selectors, secrets, grace periods, autoscalers); the checker is
# shown to catch eight planted mistakes; `promtool check rules` and `promtool
# test rules` on the autoscalers' PromQL (deploy/k8s/prometheus).
# The npm packages live in build/k8s-node (make deps installs them; the
# first run does too).  SKIP only without node, or without node's
# packages and no way to install them (offline).
source "$(dirname "$0")/../integration/lib.sh"

HERE=$(cd "$(dirname "$0")" && pwd)
NODE_DIR=${EPD_K8S_NODE_DIR:-build/k8s-node}
if ! command -v node >/dev/null 2>&1; then
  echo "SKIP: node is not installed (make deps installs nodejs)"
  exit 0
fi
if ! "$HERE/k8s_node_deps.sh" "$NODE_DIR" >"$T/npm.log" 2>&1; then
  tail -n 5 "$T/npm.log"
  echo "SKIP: the npm packages are not in $NODE_DIR and npm cannot install them (offline?)"
  exit 0
fi
command -v promtool >/dev/null 2>&1 || fail "promtool is not installed (make deps installs prometheus)"
NM="$NODE_DIR/node_modules"

note "promtool: the autoscalers' recording rules, tested against synthetic series"
promtool check rules deploy/k8s/prometheus/rules.yaml || fail "promtool check rules"
(cd deploy/k8s/prometheus && promtool test rules rules_test.yaml) || fail "promtool test rules"

note "render every overlay (a copy, with secrets made by make-secrets.sh)"
cp -r deploy/k8s "$T/k8s"
rm -f "$T/k8s/base/secrets/cluster-secret" "$T/k8s/base/secrets/api-keys"
"$T/k8s/make-secrets.sh" >/dev/null
[ "$(stat -c %a "$T/k8s/base/secrets/cluster-secret")" = 600 ] || fail "make-secrets.sh: mode"
REAL=()
if command -v kustomize >/dev/null 2>&1; then
  REAL=(kustomize build)
elif command -v kubectl >/dev/null 2>&1 && timeout 30 kubectl kustomize --help >/dev/null 2>&1; then
  REAL=(kubectl kustomize)
fi
overlays=()
for d in "$T"/k8s/overlays/*/; do
  o=$(basename "$d")
  node "$HERE/epd_k8s_render.mjs" "$NM" "$d" >"$T/$o.yaml" || fail "render overlay $o"
  overlays+=("$o=$T/$o.yaml")
  if [ ${#REAL[@]} -gt 0 ]; then
    timeout 60 "${REAL[@]}" "$d" >"$T/$o.real.yaml" 2>"$T/$o.real.err" ||
      { cat "$T/$o.real.err"; fail "${REAL[*]} $o"; }
    node "$HERE/epd_k8s_check.mjs" --compare "$NM" "$T/$o.yaml" "$T/$o.real.yaml" ||
      fail "overlay $o: the renderer and ${REAL[*]} differ"
  fi
  echo "$o: $(grep -c '^kind:' "$T/$o.yaml") objects"
done
[ ${#overlays[@]} -ge 4 ] || fail "only ${#overlays[@]} overlays"
if [ ${#REAL[@]} -gt 0 ]; then
  echo "every overlay renders as ${REAL[*]} renders it"
else
  echo "(no kustomize here: rendered by the subset renderer only)"
fi

note "schemas and cross-references of every overlay"
node "$HERE/epd_k8s_check.mjs" "$NM" "$BIN" deploy/k8s/prometheus "${overlays[@]}" ||
  fail "deploy/k8s: the errors above"

note "the checker catches planted mistakes"
# plant WHAT JS WANT: the hpa overlay changed by JS (on `objs`, with
# get(kind, name)), which the checker must refuse with an error matching WANT
plant() {
  local what=$1 js=$2 want=$3
  node --input-type=module -e "
    import { createRequire } from 'node:module';
    import { readFileSync } from 'node:fs';
    const YAML = createRequire('$PWD/$NM/x.js')('yaml');
    const objs = YAML.parseAllDocuments(readFileSync('$T/hpa.yaml', 'utf8'), { version: '1.1' }).map((d) => d.toJS());
    const get = (kind, name) => objs.find((o) => o.kind === kind && o.metadata.name === name);
    $js;
    process.stdout.write(objs.map((o) => YAML.stringify(o, { version: '1.1' })).join('---\\n'));
  " >"$T/bad.yaml" || fail "planting $what"
  if node "$HERE/epd_k8s_check.mjs" "$NM" "$BIN" deploy/k8s/prometheus "bad=$T/bad.yaml" >"$T/bad.out" 2>&1; then
    fail "the checker passed with $what"
  fi
  grep -Eq "$want" "$T/bad.out" || { cat "$T/bad.out"; fail "the checker missed $what"; }
  echo "caught: $what"
}
R="get('Deployment', 'epd-router').spec.template.spec.containers[0]"
P="get('Deployment', 'epd-prefill').spec.template.spec"
plant "a misspelt field" "$R.livenesProbe = $R.livenessProbe; delete $R.livenessProbe" \
  'livenesProbe: no such field'
plant "a flag no binary has" "$R.args.push('--policy-name=least-load')" \
  'epd-router --help .* does not list: .*--policy-name'
plant "a gRPC probe on the wrong port" "$P.containers[0].livenessProbe.grpc.port = 7001" \
  'livenessProbe gRPC port 7001 is not the --control-addr port'
plant "a selector shared by two Deployments" \
  "get('Deployment', 'epd-decode').spec.selector.matchLabels = { 'app.kubernetes.io/name': 'epd' }" \
  'Deployment/epd-decode: its selector also matches the pods of Deployment/epd-router'
plant "an HPA of a missing Deployment" \
  "get('HorizontalPodAutoscaler', 'epd-decode').spec.scaleTargetRef.name = 'epd-decoder'" \
  'no Deployment epd-decoder'
plant "a secret others may read" "$P.volumes.find((v) => v.secret).secret.defaultMode = 0o444" \
  'defaultMode 444'
plant "a grace period shorter than the drain" "$P.terminationGracePeriodSeconds = 30" \
  'terminationGracePeriodSeconds 30 s is not above'
plant "a worker Prometheus does not scrape" \
  "delete get('Deployment', 'epd-decode').spec.template.metadata.annotations" \
  'epd-decode.*not scraped on its /metrics port 9400'
echo PASS
