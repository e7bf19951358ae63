#!/usr/bin/env bash
# tests/fuzz/fuzz_run.sh, the runner of `make fuzz`: a finding in one
# target does not stop the others, and every finding is reported.
#
# Five tiny libFuzzer targets built here (clang -fsanitize=fuzzer, a second
# each; the real targets take minutes to build): ok1, crash1, ok2, crash2,
# ok3.  crash1 aborts and crash2 dereferences NULL on an input starting
# with "BOOM", which their committed seeds are, so each finds its crash at
# once, without luck.  The run must go through all five (ok2 and ok3, after
# the crashes, run their full second), exit 1, name crash1 and crash2 and
# no other, and leave one crash file for each, which replays the crash.
# A run of the ok targets alone exits 0.  Finding files left by an earlier
# run are not reported again.
set -u
T=$(mktemp -d "${TMPDIR:-/tmp}/epd-fuzzrun.XXXXXX")
trap 'rm -rf "$T"' EXIT
RUN=$(dirname "$0")/fuzz_run.sh

fail() {
  echo "FAIL: $*"
  [ -f "$T/out" ] && sed 's/^/  | /' "$T/out"
  exit 1
}

cat >"$T/ok.c" <<'EOF'
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return size > 1 && data[0] == data[1] ? 0 : 0;
}
EOF
cat >"$T/crash.c" <<'EOF'
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size >= 4 && memcmp(data, "BOOM", 4) == 0) {
#ifdef NULL_DEREF
        volatile int *p = NULL;

        return *p;
#else
        abort();
#endif
    }
    return 0;
}
EOF
mkdir -p "$T/bin" "$T/seeds"
if ! clang -fsanitize=fuzzer -o "$T/bin/ok1" "$T/ok.c" 2>"$T/cc.err"; then
  echo "SKIP: clang cannot build a libFuzzer target here: $(head -n 3 "$T/cc.err")"
  exit 0
fi
cp "$T/bin/ok1" "$T/bin/ok2"
cp "$T/bin/ok1" "$T/bin/ok3"
clang -fsanitize=fuzzer -o "$T/bin/crash1" "$T/crash.c" || fail "building crash1"
clang -fsanitize=fuzzer,address -DNULL_DEREF -o "$T/bin/crash2" "$T/crash.c" ||
  fail "building crash2"
for n in crash1 crash2; do
  mkdir -p "$T/seeds/$n"
  printf 'BOOM' >"$T/seeds/$n/boom"
done
mkdir -p "$T/seeds/ok2"
printf 'hello' >"$T/seeds/ok2/hello"

TARGETS=("$T/bin/ok1" "$T/bin/crash1" "$T/bin/ok2" "$T/bin/crash2" "$T/bin/ok3")
"$RUN" "$T/work" 1 "$T/seeds" "${TARGETS[@]}" >"$T/out" 2>&1
rc=$?
[ "$rc" = 1 ] || fail "exit status $rc, want 1"
for n in ok1 crash1 ok2 crash2 ok3; do
  grep -q "^fuzzing $n for 1s" "$T/out" || fail "$n did not run"
done
# the targets after the first crash ran to their end (libFuzzer's Done line)
for n in ok2 ok3; do
  grep -q '^Done [0-9]* runs in' "$T/work/logs/$n.log" || fail "$n did not run its second"
done
grep -q '^fuzz: 2 of 5 targets found something: crash1 crash2$' "$T/out" ||
  fail "the summary does not name crash1 and crash2"
grep -q '^FINDING in crash1: exit status [1-9]' "$T/out" || fail "no report for crash1"
grep -q '^FINDING in crash2: exit status [1-9]' "$T/out" || fail "no report for crash2"
grep -q 'SEGV' "$T/out" || fail "crash2's report does not say what it was (SEGV)"
grep -q '^FINDING in ok' "$T/out" && fail "an ok target reported as a finding"
for n in crash1 crash2; do
  files=("$T/work/findings/$n"/crash-*)
  [ -f "${files[0]}" ] || fail "no crash file for $n"
  grep -qF "${files[0]}" "$T/out" || fail "the report does not name $n's crash file"
  [ "$(head -c 4 "${files[0]}")" = BOOM ] || fail "$n's crash file is not its input"
  "$T/bin/$n" "${files[0]}" >/dev/null 2>&1 && fail "$n's crash file does not replay the crash"
done
for n in ok1 ok2 ok3; do
  [ -z "$(ls -A "$T/work/findings/$n")" ] || fail "$n left a finding file"
done

# the ok targets alone: exit 0, no finding; crash1's old file is not news
"$RUN" "$T/work" 1 "$T/seeds" "$T/bin/ok1" "$T/bin/ok3" >"$T/out" 2>&1 ||
  fail "ok targets alone: exit $?"
grep -q '^fuzz: 2 targets, no findings$' "$T/out" || fail "ok targets alone: no clean summary"
echo "PASS: every target ran, both findings reported and replayable, exit 1; clean run exit 0"
