#!/usr/bin/env bash
# Fill the folder that travels beside the working tree to the GPU machine
# (see docs/GPU_CHECK.md): what tests/gpu/check.sh needs there and the
# machine lacks. Run it here, on a Debian machine with zlib1g-dev,
# libjansson-dev, opencl-c-headers, ocl-icd-libopencl1, libclblast-dev,
# dataset-fashion-mnist and fortunes installed.
#
#   tests/gpu/prepare.sh [DIR]     (default: _gpu at the top of the tree,
#                                   which .gitignore leaves out)
#
# DIR receives:
#   include/    zlib.h, zconf.h, jansson.h, jansson_config.h; the Khronos
#               OpenCL headers (CL/*.h) and CLBlast's clblast_c.h
#   lib/        libz.so.1 and libjansson.so.4; the OpenCL ICD loader
#               (libOpenCL.so.1, ocl-icd) and CLBlast (libclblast.so.1),
#               which the OpenCL module links: used there only where the
#               machine has none of its own
#   data/fashion-mnist/   the four IDX files, gzipped
#   data/fortunes/        the texts of Debian's fortunes package: its plain
#               files less the *.dat indexes (what chorus-train and
#               docs/pytorch/train_gpt.py read of the folder), about 2.6 MiB
#   MANIFEST    where each file came from, its size and SHA-256; check.sh
#               verifies it and says in its summary what it used
# All plain files (links would not travel), about 33 MiB.
set -euo pipefail

SRC=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${1:-$SRC/_gpu}
DATA=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
FORTUNES=${FORTUNES:-/usr/share/games/fortunes}
LIMIT_MB=60

die() { echo "prepare.sh: $*" >&2; exit 1; }

# The full path of a header as the compiler finds it.
header() {
    local f
    f=$(printf '#include <%s>\n' "$1" | gcc -M -x c - 2>/dev/null | tr ' \\' '\n\n' |
        grep -m 1 "/$1\$") || die "no $1 here: install its -dev package"
    echo "$f"
}

# The real file behind a shared library's soname.
library() {
    local f
    f=$(ldconfig -p | awk -v n="$1" '$1 == n && /x86-64/ { print $NF; exit }')
    [ -n "$f" ] || die "no $1 here"
    readlink -f "$f"
}

put() { # source dest-relative-path
    mkdir -p "$(dirname "$DEST/$2")"
    cp -L "$1" "$DEST/$2"
    printf '%s  %s  %s  %s\n' "$(sha256sum "$DEST/$2" | cut -d' ' -f1)" \
        "$(stat -c %s "$DEST/$2")" "$2" "$1" >>"$DEST/MANIFEST.tmp"
}

[ -d "$DATA" ] || die "no Fashion-MNIST in $DATA (apt install dataset-fashion-mnist, or set FASHION_MNIST)"
[ -f "$FORTUNES/fortunes" ] || die "no fortunes in $FORTUNES (apt install fortunes, or set FORTUNES)"
rm -rf "$DEST"
mkdir -p "$DEST"
: >"$DEST/MANIFEST.tmp"

for h in zlib.h zconf.h jansson.h jansson_config.h; do
    put "$(header "$h")" "include/$h"
done
# The OpenCL headers the module and CLBlast's C header include: the C
# headers of the folder that holds CL/cl.h (no C++ ones).
cl_dir=$(dirname "$(header CL/cl.h)")
ncl=0
for h in "$cl_dir"/*.h; do
    put "$h" "include/CL/$(basename "$h")"
    ncl=$((ncl + 1))
done
put "$(header clblast_c.h)" "include/clblast_c.h"
for l in libz.so.1 libjansson.so.4 libOpenCL.so.1 libclblast.so.1; do
    put "$(library "$l")" "lib/$l"
done
n=0
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte \
    t10k-labels-idx1-ubyte; do
    if [ -f "$DATA/$f.gz" ]; then
        put "$DATA/$f.gz" "data/fashion-mnist/$f.gz"
    elif [ -f "$DATA/$f" ]; then
        gzip -c "$DATA/$f" >"$DEST/$f.gz"
        put "$DEST/$f.gz" "data/fashion-mnist/$f.gz"
        rm -f "$DEST/$f.gz"
    else
        die "$DATA has no $f(.gz)"
    fi
    n=$((n + 1))
done

# The fortunes: the folder's regular files, not links (the .u8 names) and
# not the *.dat indexes, which is what the readers take of it.
nf=0
for f in "$FORTUNES"/*; do
    case $f in *.dat) continue ;; esac
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    put "$f" "data/fortunes/$(basename "$f")"
    nf=$((nf + 1))
done
[ "$nf" -gt 0 ] || die "no text files in $FORTUNES"

{
    echo "# Prepared by tests/gpu/prepare.sh on $(uname -n), $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "# $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(gcc --version | head -n 1)"
    echo "# sha256  bytes  path  origin"
    cat "$DEST/MANIFEST.tmp"
} >"$DEST/MANIFEST"
rm -f "$DEST/MANIFEST.tmp"

size_kb=$(du -sk "$DEST" | cut -f1)
[ "$size_kb" -le $((LIMIT_MB * 1024)) ] || die "$DEST holds $((size_kb / 1024)) MiB, more than $LIMIT_MB"
echo "prepared $DEST: $((size_kb / 1024)) MiB, $(($(wc -l <"$DEST/MANIFEST") - 3)) files ($n data files, $nf fortunes texts, $ncl OpenCL headers)"
sed -n '4,$p' "$DEST/MANIFEST" | awk '{ printf "  %-46s %9s bytes  from %s\n", $3, $2, $4 }'
echo "carry it with the tree: the folder \"${DEST#"$SRC"/}\" (docs/GPU_CHECK.md)"
