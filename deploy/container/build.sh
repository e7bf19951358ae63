#!/usr/bin/env bash
# `make image`: the epd container image, built offline.
#
#   deploy/container/build.sh [BUILD] [TAG]      (default build, localhost/epd:latest)
#   env EPD_PODMAN="podman --root DIR --runroot DIR --storage-driver vfs"
#       the podman command line to build with (tests use a store of their own)
#   env EPD_IMAGE_STAGE_ONLY=1: stop after staging (no podman needed)
#
# The image is `FROM scratch` (deploy/container/Containerfile) plus one
# folder staged here, $BUILD/image/rootfs:
#   - the daemons and tools of $BUILD/bin (epd-router, -prefill, -decode,
#     -encoder, -ctl, -generate, -mkmodel, -bench) in /usr/bin;
#   - exactly the shared libraries they load: what ldd lists for each, plus
#     what the programs and libraries open at run time with dlopen, which
#     ldd cannot see — libfabric (the ofi backend opens it at its first
#     worker, transport/ofi/epd_xport_ofi.c), UCX's transport modules (ucx/libuct_*.so: cma, ib, rdmacm), the
#     rdma-core verbs providers and their driver files (libibverbs/,
#     /etc/libibverbs.d: the RDMA overlay needs them), glibc's NSS modules
#     for name resolution (libnss_files, libnss_dns) — and what those load;
#   - /etc/passwd, group, nsswitch.conf, an ld.so.cache (ldconfig -r), an
#     empty /tmp (1777), merged-/usr links (/lib, /lib64 -> usr/...).
# Everything comes from this machine's files: nothing is downloaded, so it
# builds with the network off.  Libraries are copied under the name ldd
# prints (the soname), dereferenced.
set -euo pipefail
build=${1:-build}
tag=${2:-localhost/epd:latest}
here=$(cd "$(dirname "$0")" && pwd)
stage="$build/image"
root="$stage/rootfs"
ma=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
libdir="/usr/lib/$ma"

bins=(epd-router epd-prefill epd-decode epd-encoder epd-ctl epd-generate epd-mkmodel epd-bench)
for b in "${bins[@]}"; do
  [ -x "$build/bin/$b" ] || { echo "image: $build/bin/$b is missing (run make first)" >&2; exit 1; }
done

rm -rf "$stage"
mkdir -p "$root/usr/bin" "$root$libdir" "$root/usr/lib64" "$root/etc" "$root/tmp" "$root/models"
chmod 1777 "$root/tmp"
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"
ln -s usr/bin "$root/bin"

# dlopen'd modules (present on this machine: taken; absent: skipped)
extra=()
for f in "$libdir"/libfabric.so.1 "$libdir"/ucx/libuct_*.so.0 "$libdir"/libibverbs/*.so "$libdir"/libnss_files.so.2 \
         "$libdir"/libnss_dns.so.2 "$libdir"/libresolv.so.2; do
  [ -e "$f" ] && extra+=("$f")
done

declare -A seen=()
# copy_lib SRC NAME: SRC dereferenced into the image under NAME, in the
# folder layout it has here (modules keep their subfolder: ucx/, libibverbs/)
copy_lib() {
  local src=$1 name=$2 rel dir
  dir=$(dirname "$(realpath -s "$src")")
  case "$dir" in
    /lib/"$ma"* | /usr/lib/"$ma"*) rel=${dir#/lib/"$ma"}; rel=${rel#/usr/lib/"$ma"} ;;
    /lib64 | /usr/lib64) rel=/../lib64 ;;
    *) rel="" ;;
  esac
  mkdir -p "$root$libdir$rel"
  [ -e "$root$libdir$rel/$name" ] || cp -L "$src" "$root$libdir$rel/$name"
}

# libs_of FILE: the absolute paths ldd resolves for FILE ("name => path" and
# the interpreter), one a line as "NAME PATH"
libs_of() {
  ldd "$1" 2>/dev/null | awk '
    $2 == "=>" && $3 ~ /^\// { print $1, $3; next }
    $1 ~ /^\// { n = $1; sub(/.*\//, "", n); print n, $1 }'
}

queue=()
for b in "${bins[@]}"; do
  cp "$build/bin/$b" "$root/usr/bin/$b"
  strip --strip-debug "$root/usr/bin/$b" 2>/dev/null || true
  queue+=("$build/bin/$b")
done
for f in "${extra[@]}"; do
  copy_lib "$f" "$(basename "$f")"
  seen[$f]=1
  queue+=("$f")
done
# breadth first over ldd's answers (ldd already lists the whole closure of
# a binary; the modules' own closures are added the same way)
while [ ${#queue[@]} -gt 0 ]; do
  f=${queue[0]}
  queue=("${queue[@]:1}")
  while read -r name path; do
    [ -n "$path" ] || continue
    if [ -z "${seen[$path]:-}" ]; then
      seen[$path]=1
      copy_lib "$path" "$name"
    fi
  done < <(libs_of "$f")
done
# the ELF interpreter the binaries name (PT_INTERP /lib64/ld-linux-x86-64.so.2)
interp=$(readelf -l "$build/bin/epd-router" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
if [ -n "$interp" ] && [ ! -e "$root$interp" ]; then
  mkdir -p "$root$(dirname "$interp")"
  cp -L "$interp" "$root$interp"
fi
# rdma-core reads its provider list from /etc/libibverbs.d
if [ -d /etc/libibverbs.d ]; then
  cp -r /etc/libibverbs.d "$root/etc/"
fi

printf 'root:x:0:0:root:/:/usr/bin/epd-router\nnobody:x:65534:65534:nobody:/:/usr/bin/epd-router\n' \
  >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
printf '%s\n%s\n%s\n' "$libdir" "$libdir/libibverbs" "$libdir/ucx" >"$root/etc/ld.so.conf"
ldconfig -r "$root" 2>/dev/null || ldconfig -r "$root"

n_libs=$(find "$root/usr/lib" "$root/usr/lib64" -type f | wc -l)
echo "image: staged $root: ${#bins[@]} programs, $n_libs libraries, $(du -sh "$root" | cut -f1)"
cp "$here/Containerfile" "$stage/Containerfile"
if [ "${EPD_IMAGE_STAGE_ONLY:-0}" = 1 ]; then
  exit 0
fi

podman_cmd=${EPD_PODMAN:-podman}
if ! command -v "${podman_cmd%% *}" >/dev/null 2>&1; then
  echo "image: ${podman_cmd%% *} is not installed (make deps installs podman)" >&2
  exit 1
fi
rev=$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)
# --pull=never: FROM scratch needs no registry; fail rather than reach one
# shellcheck disable=SC2086
$podman_cmd build --pull=never --network none -f "$stage/Containerfile" -t "$tag" \
  --label org.opencontainers.image.revision="$rev" "$stage"
echo "image: built $tag"
