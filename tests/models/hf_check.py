#!/usr/bin/env python3
"""epd-generate against the float64 numpy reference (hf_ref.py).

  hf_check.py BIN TMP MAX_TOKENS DIR=PROMPTS[@I,J,...] [DIR=PROMPTS...]

DIR is a Hugging Face model folder, PROMPTS a file of prompts as token ids
(one JSON array per line, as epd-tokenize prints them), @I,J the indexes
of the prompts to run on that folder (default all).  For every folder and
prompt:

  logits  `epd-generate --logits-out` on each path (prefill: the prompt in
          one pass; decode: one token at a time) against the reference's
          logits at every position.  Relative error of a row:
          max_j |a_j - b_j| / max_j |b_j| (a: the engine, b: the
          reference); every row must be under 1e-4.
  greedy  `epd-generate --jsonl --temperature 0 --logprobs 5` against the
          reference's greedy continuation: the same ids, step by step,
          until a step where the reference's top-2 gap is under 1e-4 (a
          tie at that precision: the comparison of this prompt stops
          there, as either choice is right).  Each logprob (the chosen
          id's and the top_logprobs') within 2e-4 * max|logits row| of the
          reference's (log-softmax moves by at most twice the largest
          logit error, which the row check bounds by 1e-4 * max|row|), and
          the top_logprobs the reference's best 5 up to that bound.

Folders with the same config and weights (one written single-file, one
sharded) share one reference computation.  The logits runs read a view of
the folder without its tokenizer files (the tokenizer has no part in
--prompt-ids --logits-out, and loading Qwen's 11 MB tokenizer.json is
most of a short run); the greedy runs read the folder itself.  EPD_HF_JOBS
(default 2) engine runs at once, beside the reference's computation.  One line per folder and check,
a FAIL line per prompt that fails (arch, path, prompt, position,
magnitude), and "N passed, N failed" at the end (counted per folder,
prompt and check); exit 1 on any failure.
"""

import hashlib
import json
import os
import resource
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_ref  # noqa: E402

TOL = 1e-4
GAP = 1e-4
TOPK = 5


def digest(model):
    """Same config and same weights (whatever the files) -> same digest."""
    h = hashlib.sha256()
    h.update(json.dumps(model.cfg, sort_keys=True).encode())
    for name, t in sorted(model.tensors.items()):
        h.update(name.encode())
        h.update(np.ascontiguousarray(t).tobytes())
    return h.hexdigest()


def eos_ids(folder, cfg):
    ids = set()
    for src in (cfg, json.load(open(os.path.join(folder, "generation_config.json")))
                if os.path.exists(os.path.join(folder, "generation_config.json")) else {}):
        e = src.get("eos_token_id")
        if isinstance(e, int):
            ids.add(e)
        elif isinstance(e, list):
            ids.update(int(x) for x in e)
    return ids


BROKEN = set()  # folders the engine failed to run once: not run again
RUNS = [0]


def run(cmd):
    folder = cmd[cmd.index("--model") + 1]
    if folder in BROKEN:
        raise RuntimeError("not run: the engine failed on this folder before")
    RUNS[0] += 1
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")  # EPD_HF_JOBS runs share the cores
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    if p.returncode != 0:
        BROKEN.add(folder)
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), p.returncode,
                                                 p.stderr.decode(errors="replace")[-400:]))
    return p.stdout.decode()


class Tally:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def add(self, ok, line=None):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            if line and "not run: the engine failed" not in line:
                print("FAIL: " + line, flush=True)


def engine_logits(gen, folder, ids, path, out):
    """epd-generate's logits rows (float64 [T][vocab]) or an error string."""
    try:
        run([gen, "--model", folder, "--prompt-ids", ",".join(map(str, ids)),
             "--logits-out", out, "--logits-path", path])
        return np.fromfile(out, dtype="<f4").astype(np.float64)
    except RuntimeError as e:
        return str(e)
    finally:
        if os.path.exists(out):
            os.unlink(out)


def engine_greedy(gen, folder, ids, max_tokens):
    """epd-generate's greedy JSON objects or an error string."""
    try:
        text = run([gen, "--model", folder, "--prompt-ids", ",".join(map(str, ids)),
                    "--max-tokens", str(max_tokens), "--temperature", "0",
                    "--jsonl", "--logprobs", str(TOPK)])
    except RuntimeError as e:
        return str(e)
    objs = [json.loads(ln) for ln in text.splitlines() if ln.strip()]
    return [o for o in objs if "id" in o]


def compare_logits(tag, path, got, ref, tally, worst):
    if isinstance(got, str):
        tally.add(False, "%s %s: %s" % (tag, path, got))
        return
    if got.size != ref.size:
        tally.add(False, "%s %s: %d floats, want %d x %d" % (tag, path, got.size, *ref.shape))
        return
    got = got.reshape(ref.shape)
    rel = np.max(np.abs(got - ref), axis=1) / np.max(np.abs(ref), axis=1)
    t = int(np.argmax(rel))
    worst[path] = max(worst[path], float(rel[t]))
    bad = np.nonzero(~(rel < TOL))[0]
    tally.add(bad.size == 0, "%s %s: %d of %d positions over %g, first at %d (rel %.3e), "
              "worst at %d (rel %.3e, max|ref| %.3g)"
              % (tag, path, bad.size, rel.size, TOL, bad[0] if bad.size else -1,
                 rel[bad[0]] if bad.size else 0, t, rel[t], np.max(np.abs(ref[t]))))


def compare_greedy(tag, objs, steps, tally, stats):
    if isinstance(objs, str):
        tally.add(False, "%s greedy: %s" % (tag, objs))
        return
    why = None
    n = 0
    for s, (tok, gap, lp, rowmax) in enumerate(steps):
        if gap < GAP:
            stats["ties"] += 1
            break
        if s >= len(objs):
            why = "step %d: the engine stopped after %d tokens, the reference goes on with %d" % (
                s, len(objs), tok)
            break
        o = objs[s]
        if o["id"] != tok:
            why = "step %d: id %d, reference %d (its top-2 gap %.3g, ref logprob of %d: %.6f)" % (
                s, o["id"], tok, gap, o["id"], lp[o["id"]] if 0 <= o["id"] < lp.size else float("nan"))
            break
        bound = 2 * TOL * rowmax
        err = abs(float(o["logprob"]) - lp[tok])
        stats["lp_err"] = max(stats["lp_err"], err)
        if not err <= bound:
            why = "step %d: logprob %.7f, reference %.7f (bound %.2g)" % (s, o["logprob"], lp[tok], bound)
            break
        tops = o.get("top_logprobs") or []
        if len(tops) != TOPK:
            why = "step %d: %d top_logprobs, want %d" % (s, len(tops), TOPK)
            break
        kth = np.partition(lp, -TOPK)[-TOPK]
        for i_, lpv in tops:
            e2 = abs(float(lpv) - lp[i_])
            if not (e2 <= bound and lp[i_] >= kth - bound):
                why = "step %d: top_logprobs [%d, %.7f]: reference %.7f, its 5th best %.7f" % (
                    s, i_, lpv, lp[i_], kth)
                break
        if why:
            break
        n += 1
    else:
        if len(objs) != len(steps):
            why = "the engine gave %d tokens, the reference %d" % (len(objs), len(steps))
    stats["compared"] += n
    tally.add(why is None, "%s greedy: %s" % (tag, why))


def logits_view(folder, tmp):
    """The folder without its tokenizer files (symlinks to the rest): for
    --prompt-ids --logits-out the tokenizer plays no part, and loading a
    151k-entry tokenizer.json is most of a short run's time."""
    view = os.path.join(tmp, "view-" + os.path.basename(folder.rstrip("/")))
    os.makedirs(view, exist_ok=True)
    for fn in os.listdir(folder):
        if not fn.startswith("tokenizer") and not os.path.exists(os.path.join(view, fn)):
            os.symlink(os.path.abspath(os.path.join(folder, fn)), os.path.join(view, fn))
    return view


def main(argv):
    if len(argv) < 5:
        sys.stderr.write(__doc__)
        return 2
    bindir, tmp, max_tokens = argv[1], argv[2], int(argv[3])
    gen = os.path.join(bindir, "epd-generate")
    jobs = int(os.environ.get("EPD_HF_JOBS", "2"))
    groups = {}  # digest -> [(folder, prompt indexes)], in the order given
    models, prompt_sets = {}, {}
    for arg in argv[4:]:
        folder, pfile = arg.split("=", 1)
        pfile, _, subset = pfile.partition("@")
        with open(pfile) as f:
            prompts = [json.loads(ln) for ln in f if ln.strip()]
        which = [int(i) for i in subset.split(",")] if subset else list(range(len(prompts)))
        m = hf_ref.load_model(folder)
        d = digest(m) + pfile
        if d not in groups:
            groups[d] = []
            models[d] = m
            prompt_sets[d] = prompts
        groups[d].append((folder, which))

    tally = Tally()
    pool = ThreadPoolExecutor(max_workers=jobs)
    seq = [0]

    def out_file():
        seq[0] += 1
        return os.path.join(tmp, "logits-%d.f32" % seq[0])

    for d, members in groups.items():
        m = models[d]
        prompts = prompt_sets[d]
        eos = eos_ids(members[0][0], m.cfg)
        per = {f: {"prefill": 0.0, "decode": 0.0, "ties": 0, "compared": 0, "lp_err": 0.0}
               for f, _ in members}
        views = {f: logits_view(f, tmp) for f, _ in members}

        def tag(folder, pi):
            return "%s (%s) prompt %d (%d tokens)" % (os.path.basename(folder), m.kind, pi,
                                                      len(prompts[pi]))
        needed = sorted({pi for _, which in members for pi in which})
        # the engine's greedy runs need no reference: start them all now
        greedy_jobs = {(f, pi): pool.submit(engine_greedy, gen, f, prompts[pi], max_tokens)
                       for f, which in members for pi in which}
        last_rows = []
        for pi in needed:
            ids = prompts[pi]
            runs = {(f, path): pool.submit(engine_logits, gen, views[f], ids, path, out_file())
                    for f, which in members if pi in which for path in ("prefill", "decode")}
            ref = m.forward(ids)  # while the engine runs
            last_rows.append(ref[-1].copy())
            for (f, path), fut in runs.items():
                compare_logits(tag(f, pi), path, fut.result(), ref, tally, per[f])
            del ref, runs
        greedy = m.greedy_many([prompts[pi] for pi in needed], max_tokens, eos, last_rows)
        for k, pi in enumerate(needed):
            for f, which in members:
                if pi in which:
                    compare_greedy(tag(f, pi), greedy_jobs[(f, pi)].result(), greedy[k], tally, per[f])
        del greedy, greedy_jobs
        for f, which in members:
            w = per[f]
            print("%s (%s, %d prompts): worst row rel error prefill %.2e decode %.2e; greedy %d "
                  "steps equal, %d prompts stopped at a top-2 gap < %g, worst logprob error %.2e"
                  % (os.path.basename(f), m.kind, len(which), w["prefill"], w["decode"],
                     w["compared"], w["ties"], GAP, w["lp_err"]), flush=True)
    pool.shutdown()
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print("CPU seconds: reference and comparisons %.1f, epd-generate %.1f (%d runs)"
          % (me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime, RUNS[0]))
    print("%d passed, %d failed" % (tally.passed, tally.failed))
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
