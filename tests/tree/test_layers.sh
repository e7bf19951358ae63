#!/usr/bin/env bash
# The structure the daemons keep (README "Layout", daemon/README.md):
#   - inside each daemon folder (encoder/, prefill/, decode/, router/ and
#     its tools), calls between sibling files go one way: for no two object
#     files does each define a symbol the other uses;
#   - no source file of those folders is over 1,000 lines;
#   - no daemon folder uses another daemon folder's symbols (the Makefile's
#     include paths refuse the headers; this catches a declaration copied
#     by hand).
# Reads the object files of $EPD_BUILD (nm), so it judges what was built.
set -u
build=${EPD_BUILD:-build}
root=$(cd "$(dirname "$0")/../.." && pwd)
fail=0

# nm runs once per object; the pairs below read its answers from files
cache=$(mktemp -d "${TMPDIR:-/tmp}/epd-layers.XXXXXX")
trap 'rm -rf "$cache"' EXIT
key() { echo "$1" | tr '/' '_'; }
defined() {
  local k; k="$cache/d$(key "$1")"
  [ -e "$k" ] || nm --defined-only -g "$1" 2>/dev/null | awk '$2 ~ /[TDBR]/ {print $3}' | sort -u >"$k"
  cat "$k"
}
used() {
  local k; k="$cache/u$(key "$1")"
  [ -e "$k" ] || nm -u "$1" 2>/dev/null | awk '{print $2}' | sort -u >"$k"
  cat "$k"
}

for dir in encoder prefill decode router; do
  objs=("$build"/obj/$dir/*.o)
  [ -e "${objs[0]}" ] || { echo "test_layers: no objects in $build/obj/$dir (build first)"; exit 1; }
  for ((i = 0; i < ${#objs[@]}; i++)); do
    for ((j = i + 1; j < ${#objs[@]}; j++)); do
      a=${objs[$i]} b=${objs[$j]}
      ab=$(comm -12 <(used "$a") <(defined "$b") | head -3 | tr '\n' ' ')
      ba=$(comm -12 <(used "$b") <(defined "$a") | head -3 | tr '\n' ' ')
      if [ -n "$ab" ] && [ -n "$ba" ]; then
        echo "FAIL: $dir/$(basename "$a" .o).c and $dir/$(basename "$b" .o).c call each other" \
             "($(basename "$a" .o) uses: $ab; $(basename "$b" .o) uses: $ba)"
        fail=1
      fi
    done
  done
  for f in "$root"/$dir/*.c "$root"/$dir/*/*.c; do
    [ -e "$f" ] || continue
    n=$(wc -l <"$f")
    if [ "$n" -gt 1000 ]; then
      echo "FAIL: ${f#$root/} has $n lines (at most 1,000)"
      fail=1
    fi
  done
done
# no daemon uses another daemon's definitions
for dir in encoder prefill decode router; do
  mine=$(cat "$build"/obj/$dir/*.o >/dev/null 2>&1; for o in "$build"/obj/$dir/*.o; do used "$o"; done | sort -u)
  for other in encoder prefill decode router; do
    [ "$other" = "$dir" ] && continue
    theirs=$(for o in "$build"/obj/$other/*.o; do defined "$o"; done | grep -v '^main$' | sort -u)
    both=$(comm -12 <(echo "$mine") <(echo "$theirs") | head -3 | tr '\n' ' ')
    if [ -n "$both" ]; then
      echo "FAIL: $dir/ uses $other/'s symbols: $both"
      fail=1
    fi
  done
done
[ $fail -eq 0 ] && echo "layers: one-way calls inside encoder/ prefill/ decode/ router/, every file under 1,000 lines, no daemon uses another's code"
exit $fail
