#!/usr/bin/env python3
"""Renders chat templates with Debian's python3-jinja2 the way Hugging Face
transformers' apply_chat_template does (transformers/utils/
chat_template_utils.py, _compile_jinja_template and render_jinja_template):
an ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the
loopcontrols extension; raise_exception, strftime_now and transformers' own
tojson (json.dumps with ensure_ascii=False); rendered with messages,
tools=None, documents=None, add_generation_prompt, the special tokens of
tokenizer_config.json and the template kwargs (enable_thinking).
strftime_now answers for 26 Jul 2024 so that a rendering does not depend
on the day it runs (epd-tokenize --date "26 Jul 2024" is told the same).

  chat_jinja2.py CASES.jsonl OUT.jsonl
CASES: one JSON object per line: {"config": path of a tokenizer_config.json,
"messages": [...], "add_generation_prompt": bool, "kwargs": {...}}.
OUT: one JSON object per line: {"text": rendered} or {"error": message}.
"""
import datetime
import json
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_NOW = datetime.datetime(2024, 7, 26, 12, 0, 0)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' override of jinja2's tojson (which HTML-escapes)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return FIXED_NOW.strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def special_tokens(config):
    """transformers passes its special_tokens_map: the tokens as strings
    (an AddedToken dict's content), None where the config has null."""
    out = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        if key in config:
            v = config[key]
            out[key] = v.get("content") if isinstance(v, dict) else v
    return out


def template_text(config):
    t = config["chat_template"]
    if isinstance(t, list):
        t = {e["name"]: e["template"] for e in t}["default"]
    return t


def main():
    env = environment()
    compiled = {}
    configs = {}
    with open(sys.argv[1], encoding="utf-8") as f, open(sys.argv[2], "w", encoding="utf-8") as out:
        for line in f:
            case = json.loads(line)
            path = case["config"]
            if path not in compiled:
                with open(path, encoding="utf-8") as c:
                    configs[path] = json.load(c)
                compiled[path] = env.from_string(template_text(configs[path]))
            try:
                text = compiled[path].render(
                    messages=case["messages"], tools=None, documents=None,
                    add_generation_prompt=case["add_generation_prompt"],
                    **special_tokens(configs[path]), **case.get("kwargs", {}))
                out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
            except Exception as e:  # pylint: disable=broad-except
                out.write(json.dumps({"error": repr(e)}) + "\n")


if __name__ == "__main__":
    main()
