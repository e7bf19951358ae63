#!/usr/bin/env bash
# The documentation a new user reads (CONTRIBUTING.md "Documentation"):
#   - README.md is at most 250 lines;
#   - LICENSE, CHANGELOG.md and CONTRIBUTING.md exist;
#   - every relative link in every tracked Markdown file resolves to a file
#     or folder inside the repository (an anchor after '#' is not checked;
#     http(s) and mailto links are not followed: no network in tests).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
fail=0; n=0

lines=$(wc -l <README.md)
if [ "$lines" -gt 250 ]; then
  echo "FAIL README.md has $lines lines (at most 250; move detail to docs/)"; fail=$((fail + 1))
fi
for f in LICENSE CHANGELOG.md CONTRIBUTING.md; do
  [ -s "$f" ] || { echo "FAIL $f is missing"; fail=$((fail + 1)); }
done

# tracked files when this is a git checkout, else every .md outside build/
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.md')
else
  mapfile -t files < <(find . -name '*.md' -not -path './build/*' -not -path '*/node_modules/*' | sed 's|^\./||')
fi
for f in "${files[@]}"; do
  dir=$(dirname "$f")
  # [text](target) and [text]: target definitions; code spans are skipped
  while IFS= read -r target; do
    [ -n "$target" ] || continue
    case "$target" in
      http://*|https://*|mailto:*|\#*) continue ;;
    esac
    path=${target%%#*}
    n=$((n + 1))
    resolved=$(realpath -m "$dir/$path")
    case "$resolved" in
      "$root"|"$root"/*) ;;
      *) echo "FAIL $f: link '$target' leaves the repository"; fail=$((fail + 1)); continue ;;
    esac
    if [ ! -e "$resolved" ]; then
      echo "FAIL $f: link '$target' does not resolve"; fail=$((fail + 1))
    fi
  done < <(sed -e 's/`[^`]*`//g' "$f" | grep -oE '\]\([^) ]+\)' | sed -e 's/^](//' -e 's/)$//')
done
echo "test_docs: README.md $lines lines, $n relative links in ${#files[@]} Markdown files, $fail failed"
[ "$fail" -eq 0 ]
