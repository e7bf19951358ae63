#!/usr/bin/env bash
# The structure the daemons keep (README.md "Layout", CONTRIBUTING.md, daemon/README.md):
#   - inside each daemon folder (encoder/, prefill/, decode/, router/ and
#     its tools), calls between sibling files go one way: for no two object
#     files does each define a symbol the other uses;
#   - no source file of those folders is over 1,000 lines;
#   - no daemon folder uses another daemon folder's symbols (the Makefile's
#     include paths refuse the headers; this catches a declaration copied
#     by hand).
# The same two rules (one-way calls, files under 1,000 lines) hold in every
# other folder: common/, transport/ and each transport backend folder
# (transport/ucx/, transport/ofi/: their own folders, as a backend never
# calls a sibling backend), engine/, api/, kv/, proto/, daemon/, client/ and
# bench/ — less the
# files LONG lists, each over 1,000 lines (a debt: the list may only
# shrink, and a listed file that got under 1,000 lines fails until it is
# taken off; empty since 2026-12-07).  Dependencies point down the floors, common/ < transport/,
# engine/ < api/, kv/, proto/ < daemon/, client/ < the daemons < bench/: no
# folder uses a definition of one above it (nor one beside it on its floor:
# api/, kv/ and proto/, daemon/ and client/ know nothing of each other).
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

LONG=" "
for dir in encoder prefill decode router common transport transport/ucx transport/ofi engine api kv proto daemon client bench; do
  objs=("$build"/obj/$dir/*.o)
  # a backend switched off at build time has no objects
  case $dir in transport/*) [ -e "${objs[0]}" ] || continue ;; esac
  [ -e "${objs[0]}" ] || { echo "test_layers: no objects in $build/obj/$dir (build first)"; exit 1; }
  # one pass over every (object, symbol) of the folder, sorted by symbol
  # with each definition before its uses: u[a" "b] gathers (up to three,
  # in order) the symbols object a uses that object b defines; a pair with
  # both directions calls each other.  (Was a loop over the pairs, each
  # forking comm and friends: 150 s of CPU on a 2-core machine.)
  circles=$(for o in "${objs[@]}"; do
              n=$(basename "$o" .o)
              defined "$o" | sed "s|^|D $n |"
              used "$o" | sed "s|^|U $n |"
            done | sort -k3,3 -k1,1 -k2,2 | awk -v dir="$dir" '
    $1 == "D" { d[$3] = d[$3] " " $2; next }
    {
      m = split(d[$3], def, " ")
      for (i = 1; i <= m; i++) {
        if (def[i] == $2) continue
        k = $2 " " def[i]
        if (c[k]++ < 3) u[k] = u[k] $3 " "
      }
    }
    END {
      for (k in u) {
        split(k, ab, " ")
        r = ab[2] " " ab[1]
        if (ab[1] < ab[2] && (r in u)) {
          printf "FAIL: %s/%s.c and %s/%s.c call each other (%s uses: %s; %s uses: %s)\n",
                 dir, ab[1], dir, ab[2], ab[1], u[k], ab[2], u[r]
        }
      }
    }')
  if [ -n "$circles" ]; then
    echo "$circles"
    fail=1
  fi
  # transport/'s backend folders are counted as folders of their own
  subs="$root/$dir/*/*.c"
  [ "$dir" = transport ] && subs=
  for f in "$root"/$dir/*.c $subs; do
    [ -e "$f" ] || continue
    n=$(wc -l <"$f")
    case $LONG in
      *" ${f#$root/} "*)
        if [ "$n" -le 1000 ]; then
          echo "FAIL: ${f#$root/} has $n lines now: take it off LONG in $0"
          fail=1
        fi ;;
      *)
        if [ "$n" -gt 1000 ]; then
          echo "FAIL: ${f#$root/} has $n lines (at most 1,000)"
          fail=1
        fi ;;
    esac
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
# dependencies point down the floors: a folder uses nothing a folder above
# it defines (a folder's own objects, not its tools/)
floor_of() {
  case $1 in
    common) echo 1 ;; transport | engine) echo 2 ;; api | kv | proto) echo 3 ;; daemon | client) echo 4 ;;
    encoder | prefill | decode | router) echo 5 ;; bench) echo 6 ;;
  esac
}
folders="common transport engine api kv proto daemon client encoder prefill decode router bench"
for dir in $folders; do
  objs="$build/obj/$dir/*.o"
  [ "$dir" = transport ] && objs="$objs $build/obj/transport/*/*.o"
  for o in $objs; do [ -e "$o" ] && used "$o"; done | sort -u >"$cache/used_$dir"
  for o in $objs; do [ -e "$o" ] && defined "$o"; done | grep -v '^main$' | sort -u >"$cache/def_$dir"
done
for dir in $folders; do
  for other in $folders; do
    [ "$other" != "$dir" ] && [ "$(floor_of "$other")" -ge "$(floor_of "$dir")" ] || continue
    both=$(comm -12 "$cache/used_$dir" "$cache/def_$other" | head -3 | tr '\n' ' ')
    if [ -n "$both" ]; then
      echo "FAIL: $dir/ uses $other/'s symbols (a floor above it): $both"
      fail=1
    fi
  done
done
[ $fail -eq 0 ] && echo "layers: one-way calls inside every folder (each transport backend its own), every file under 1,000 lines but the $(echo $LONG | wc -w) listed, no daemon uses another's code, dependencies only downward (common < transport, engine < api, kv, proto < daemon, client < daemons < bench)"
exit $fail
