#!/usr/bin/env bash
# The OpenAI sampling fields through a real cluster (router, 1 prefill, 1
# decode, the tiny byte-level model): presence_penalty, frequency_penalty,
# repetition_penalty, logit_bias, min_tokens, ignore_eos and stop_token_ids
# give the text epd-generate gives with the same flags (the sampler both
# share, engine/epd_sample.c; prefill samples the first token, decode the
# rest), greedy and seeded, streamed and not.  Then nothing silently
# ignored and a hostile battery over the new fields: every one a 4xx
# naming its field; usage.prompt_tokens_details.cached_tokens is the
# prefix cache's hit on a repeated prompt; /tokenize -> /detokenize round
# trips and a prompt of token ids answers as its text; /version and
# /v1/models' max_model_len; the router healthy after.
source "$(dirname "$0")/lib.sh"

mkmodel "$T/m" "${TINY_MODEL_FLAGS[@]}"
start_router r --model "$T/m" --heartbeat-ms 200
start_daemon d decode --model "$T/m" --worker-id decode-0 --kv-blocks 512 --state-slots 32 \
  --router "$r_ADDR"
start_daemon p prefill --model "$T/m" --worker-id prefill-0 --router "$r_ADDR"
wait_router_state "$r_ADDR" decode-0 READY
wait_router_state "$r_ADDR" prefill-0 READY

"$PYTHON3" - "$r_HTTP" "$T/m" "$BIN/epd-generate" <<'PY' || fail "the sampling fields"
import http.client, json, subprocess, sys, urllib.parse
url, model_dir, gen = sys.argv[1:4]
u = urllib.parse.urlparse(url)

def post(body, path="/v1/completions"):
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    c.request("POST", path, json.dumps(body) if not isinstance(body, str) else body,
              {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data

def complete(body):
    st, data = post(body)
    assert st == 200, (st, data, body)
    b = json.loads(data)
    return b["choices"][0]["text"], b["choices"][0]["finish_reason"], b["usage"]

def stream(body):
    body = dict(body, stream=True)
    st, data = post(body)
    assert st == 200, (st, data)
    text = ""
    finish = None
    for line in data.decode().split("\n\n"):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        ch = ev["choices"][0]
        text += ch["text"]
        finish = ch["finish_reason"] or finish
    return text, finish

def generate(prompt, max_tokens, flags):
    out = subprocess.run([gen, "--model", model_dir, "--prompt", prompt, "--max-tokens",
                          str(max_tokens)] + flags, check=True, capture_output=True).stdout
    assert out.endswith(b"\n"), out
    return out[:-1].decode("utf-8", "replace")

cases = [
    # (request fields, epd-generate flags)
    ({"temperature": 0}, []),
    ({"temperature": 0, "presence_penalty": 2, "frequency_penalty": 2},
     ["--presence-penalty", "2", "--frequency-penalty", "2"]),
    ({"temperature": 0, "frequency_penalty": -1.5}, ["--frequency-penalty", "-1.5"]),
    ({"temperature": 0, "repetition_penalty": 1.8}, ["--repetition-penalty", "1.8"]),
    ({"temperature": 0.9, "seed": 42, "repetition_penalty": 1.3, "presence_penalty": 0.5},
     ["--temperature", "0.9", "--seed", "42", "--repetition-penalty", "1.3",
      "--presence-penalty", "0.5"]),
    ({"temperature": 1, "top_p": 0.9, "seed": 7, "logit_bias": {"101": 5, "32": -3}},
     ["--temperature", "1", "--top-p", "0.9", "--seed", "7", "--logit-bias", "101:5,32:-3"]),
    ({"temperature": 0, "logit_bias": {"65": 100}}, ["--logit-bias", "65:100"]),
    # OpenAI clamps to [-100, 100]: 1e300 is +100
    ({"temperature": 0, "logit_bias": {"66": 1e300}}, ["--logit-bias", "66:100"]),
    # EOS favoured, but masked for 5 tokens
    ({"temperature": 0, "logit_bias": {"257": 100}, "min_tokens": 5},
     ["--logit-bias", "257:100", "--min-tokens", "5"]),
]
prompts = ["Hello", "the the the the the"]
for fields, flags in cases:
    for prompt in prompts:
        body = dict({"model": "m", "prompt": prompt, "max_tokens": 12}, **fields)
        want = generate(prompt, 12, flags)
        text, finish, usage = complete(body)
        assert text == want, ("text differs", fields, prompt, text, want)
        st_text, st_finish = stream(body)
        assert st_text == want and st_finish == finish, ("stream differs", fields, st_text, want)
        print("ok %s %r: %r" % (json.dumps(fields), prompt, text[:24]))
# repetition penalty changes greedy output of a repetitive prompt (the test
# above would pass with every field ignored if it did not)
a = complete({"model": "m", "prompt": prompts[0], "max_tokens": 12, "temperature": 0})[0]
b = complete({"model": "m", "prompt": prompts[0], "max_tokens": 12, "temperature": 0,
              "presence_penalty": 2, "frequency_penalty": 2})[0]
assert a != b, (a, b)
text, finish, usage = complete({"model": "m", "prompt": "x", "max_tokens": 4, "temperature": 0,
                                "logit_bias": {"65": 100}})
assert text == "AAAA" and finish == "length", (text, finish)
# ignore_eos: an all-EOS generation runs to max_tokens (EOS has no text)
text, finish, usage = complete({"model": "m", "prompt": "x", "max_tokens": 6, "temperature": 0,
                                "logit_bias": {"257": 100}, "ignore_eos": True})
assert text == "" and finish == "length" and usage["completion_tokens"] == 6, (text, finish, usage)
text, finish, usage = complete({"model": "m", "prompt": "x", "max_tokens": 6, "temperature": 0,
                                "logit_bias": {"257": 100}})
assert finish == "stop" and usage["completion_tokens"] == 1, (finish, usage)
# stop_token_ids: the stop token ends it, its text left out (as vLLM's)
text, finish, usage = complete({"model": "m", "prompt": "x", "max_tokens": 6, "temperature": 0,
                                "logit_bias": {"65": 50, "66": 100}, "min_tokens": 2,
                                "stop_token_ids": [66]})
assert text == "AA" and finish == "stop" and usage["completion_tokens"] == 3, (text, finish, usage)
print("ok ignore_eos, min_tokens, stop_token_ids")

# logprobs: equal to epd-generate --jsonl --logprobs K (the raw logits'
# log-softmax), greedy and seeded, streamed and not, completions and chat
def jsonl(prompt, max_tokens, k, flags):
    out = subprocess.run([gen, "--model", model_dir, "--prompt", prompt, "--max-tokens",
                          str(max_tokens), "--jsonl", "--logprobs", str(k)] + flags,
                         check=True, capture_output=True).stdout.decode()
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]

def close(a, b):
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))

def sse(body, path):
    st, data = post(dict(body, stream=True), path)
    assert st == 200, (st, data)
    return [json.loads(l[6:]) for l in data.decode().split("\n\n")
            if l.startswith("data: {")]

for fields, flags in [({"temperature": 0}, []),
                      ({"temperature": 0.8, "seed": 5}, ["--temperature", "0.8", "--seed", "5"])]:
    k = 3
    want = jsonl("Hello", 6, k, flags)
    # completions, not streamed
    st, data = post(dict({"model": "m", "prompt": "Hello", "max_tokens": 6, "logprobs": k},
                         **fields))
    assert st == 200, (st, data)
    lp = json.loads(data)["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(want), (lp, want)
    for i, w in enumerate(want):
        assert close(lp["token_logprobs"][i], w["logprob"]), (i, lp["token_logprobs"][i], w)
        got_top = sorted(lp["top_logprobs"][i].values(), reverse=True)
        assert len(got_top) == k and all(close(g, t[1]) for g, t in
                                         zip(got_top, w["top_logprobs"])), (got_top, w)
    assert lp["text_offset"][0] == 0
    # chat, not streamed and streamed
    wantc = jsonl("<|user|>\nHello\n<|assistant|>\n", 6, k, flags)
    body = dict({"model": "m", "messages": [{"role": "user", "content": "Hello"}],
                 "max_tokens": 6, "logprobs": True, "top_logprobs": k}, **fields)
    st, data = post(body, "/v1/chat/completions")
    assert st == 200, (st, data)
    content = json.loads(data)["choices"][0]["logprobs"]["content"]
    streamed = []
    for ev in sse(body, "/v1/chat/completions"):
        for ch in ev["choices"]:
            if ch.get("logprobs"):
                streamed += ch["logprobs"]["content"]
    for got in (content, streamed):
        assert len(got) == len(wantc), (got, wantc)
        for c_, w in zip(got, wantc):
            assert close(c_["logprob"], w["logprob"]), (c_, w)
            assert bytes(c_["bytes"]).decode("utf-8", "replace") == w["text"], (c_, w)
            assert [t["logprob"] for t in c_["top_logprobs"]] and all(
                close(t["logprob"], x[1]) for t, x in zip(c_["top_logprobs"], w["top_logprobs"]))
    # completions streamed: the logprobs chunk
    toks = []
    for ev in sse({"model": "m", "prompt": "Hello", "max_tokens": 6, "logprobs": 0, **fields},
                  "/v1/completions"):
        for ch in ev["choices"]:
            if ch.get("logprobs"):
                toks += ch["logprobs"]["token_logprobs"]
    assert len(toks) == len(want) and all(close(a, w["logprob"]) for a, w in zip(toks, want))
    print("ok logprobs %s == epd-generate --jsonl (completions, chat, streamed)" %
          json.dumps(fields))

# nothing silently ignored; the hostile battery: all 4xx naming the field
msgs = [{"role": "user", "content": "hi"}]
bad = [
    ({"model": "m", "prompt": "a", "tools": [{"type": "function"}]}, "tools"),
    ({"model": "m", "messages": msgs, "tools": [{"type": "function",
                                                 "function": {"name": "f"}}]}, "tools"),
    ({"model": "m", "messages": msgs, "tool_choice": "auto"}, "tool_choice"),
    ({"model": "m", "messages": msgs, "response_format": {"type": "json_object"}},
     "response_format"),
    ({"model": "m", "messages": msgs, "functions": [{"name": "f"}]}, "functions"),
    ({"model": "m", "prompt": "a", "suffix": "z"}, "suffix"),
    ({"model": "m", "messages": msgs, "audio": {"voice": "x"}}, "audio"),
    ({"model": "m", "prompt": "a", "logprobs": 21}, "logprobs"),
    ({"model": "m", "prompt": "a", "logprobs": -1}, "logprobs"),
    ({"model": "m", "messages": msgs, "logprobs": 1}, "logprobs"),
    ({"model": "m", "messages": msgs, "top_logprobs": 2}, "top_logprobs"),
    ({"model": "m", "messages": msgs, "logprobs": True, "top_logprobs": 1000}, "top_logprobs"),
    ({"model": "m", "prompt": "a", "n": -1}, "n"),
    ({"model": "m", "prompt": "a", "n": 17}, "n"),
    ({"model": "m", "prompt": "a", "no_such_field": 1}, "no_such_field"),
    ({"model": "m", "prompt": "a", "logit_bias": {"258": 1}}, "logit_bias"),
    ({"model": "m", "prompt": "a", "logit_bias": {"4294967296": 1}}, "logit_bias"),
    ({"model": "m", "prompt": "a", "logit_bias": {str(i): 1 for i in range(301)}},
     "logit_bias"),
    ({"model": "m", "prompt": "a", "presence_penalty": 1e300}, "presence_penalty"),
    ({"model": "m", "prompt": "a", "repetition_penalty": -1}, "repetition_penalty"),
    ({"model": "m", "prompt": "a", "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ({"model": "m", "prompt": "a", "stop_token_ids": [100000]}, "stop_token_ids"),
    ({"model": "m", "prompt": "a", "stop_token_ids": list(range(65))}, "stop_token_ids"),
    ({"model": "m", "prompt": [1] * 99000}, "prompt"),
    # over the body's element limit: refused before it is parsed (no param)
    ({"model": "m", "prompt": [1] * 100000}, None),
]
for body, param in bad:
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    st, data = post(body, path)
    e = json.loads(data)["error"]
    assert 400 <= st < 500 and e["param"] == param, (body if len(str(body)) < 300 else param,
                                                       st, e)
print("ok %d refusals, each naming its field" % len(bad))
# /tokenize -> /detokenize round trip; token-id prompts answer as their text
def post_json(path, body):
    st, data = post(body, path)
    return st, json.loads(data)
for text in ["Hello", "caf\u00e9 \u2603 ok", "the the the"]:
    st, t = post_json("/tokenize", {"model": "m", "prompt": text})
    assert st == 200 and t["count"] == len(t["tokens"]) and t["max_model_len"] == 2048, (st, t)
    st, d = post_json("/detokenize", {"model": "m", "tokens": t["tokens"]})
    assert st == 200 and d["prompt"] == text, (st, d, text)
    st, t2 = post_json("/tokenize", {"prompt": text, "add_special_tokens": False})
    assert st == 200 and t2["tokens"] == t["tokens"][1:], (t, t2)  # BOS first
    for fields in [{"temperature": 0}, {"temperature": 0.8, "seed": 3}]:
        a = complete(dict({"model": "m", "prompt": text, "max_tokens": 8}, **fields))
        b = complete(dict({"model": "m", "prompt": t["tokens"], "max_tokens": 8}, **fields))
        c = complete(dict({"model": "m", "prompt": [t["tokens"]], "max_tokens": 8}, **fields))
        assert a == b == c, (text, fields, a, b, c)
msgs2 = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
st, t = post_json("/tokenize", {"model": "m", "messages": msgs2})
assert st == 200, (st, t)
st, d = post_json("/detokenize", {"tokens": t["tokens"]})
assert d["prompt"] == "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n", d
st, data = post({"model": "m", "messages": msgs2, "max_tokens": 2}, "/v1/chat/completions")
assert st == 200 and json.loads(data)["usage"]["prompt_tokens"] == t["count"], (st, data, t)
st, e = post_json("/tokenize", {"model": "m", "messages": msgs2, "tools": [{"type": "x"}]})
assert st == 400 and e["error"]["param"] == "tools", (st, e)
print("ok /tokenize -> /detokenize round trips; token-id prompts == their text; messages")
for body, path, param in [({"prompt": 5}, "/tokenize", "prompt"),
                          ({"prompt": "x", "bogus": 1}, "/tokenize", "bogus"),
                          ({"tokens": [1, 258]}, "/detokenize", "tokens"),
                          ({"tokens": [-1]}, "/detokenize", "tokens"),
                          ({"tokens": "abc"}, "/detokenize", "tokens"),
                          ({"model": "m", "prompt": [1, 258]}, "/v1/completions", "prompt"),
                          ({"model": "m", "prompt": [1] * 2048}, "/v1/completions", "prompt")]:
    st, e = post_json(path, body)
    assert st == 400 and e["error"]["param"] == param, (body, st, e)
c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
c.request("GET", "/version")
r = c.getresponse()
v = json.loads(r.read())
assert r.status == 200 and isinstance(v["version"], str), v
c.request("GET", "/v1/models")
r = c.getresponse()
ms = json.loads(r.read())
assert ms["data"][0]["max_model_len"] == 2048, ms
c.request("GET", "/v1/models/m")
r = c.getresponse()
assert json.loads(r.read())["max_model_len"] == 2048
c.close()
print("ok /version %s, /v1/models max_model_len" % v["version"])

# usage.prompt_tokens_details.cached_tokens: 0, then the prefix cache's hit
def metric(name):
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    c.request("GET", "/metrics")
    body = c.getresponse().read().decode()
    c.close()
    return sum(float(l.split()[-1]) for l in body.splitlines()
               if l.startswith(name + " ") or l.startswith(name + "{"))
long_prompt = "cached tokens are counted in the usage of the answer " * 3
usage1 = complete({"model": "m", "prompt": long_prompt, "max_tokens": 2})[2]
before = metric("epd_router_cached_tokens_total")
usage2 = complete({"model": "m", "prompt": long_prompt, "max_tokens": 2})[2]
hit = metric("epd_router_cached_tokens_total") - before
assert usage1["prompt_tokens_details"]["cached_tokens"] == 0, usage1
c2 = usage2["prompt_tokens_details"]["cached_tokens"]
assert 0 < c2 < usage2["prompt_tokens"] and c2 == hit, (usage2, hit)
print("ok cached_tokens %d of %d prompt tokens on a repeat" % (c2, usage2["prompt_tokens"]))
c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
c.request("GET", "/health")
r = c.getresponse()
assert r.status == 200, r.status
r.read()
text, finish, usage = complete({"model": "m", "prompt": "Hello", "max_tokens": 4,
                                "temperature": 0})
assert text == generate("Hello", 4, []), text
print("ok the router is healthy after")
PY
wait_blocks_free "$d_ADDR"
finish_ok
