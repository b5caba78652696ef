#!/bin/sh
# make installcheck: a program built against the installed library with
# pkg-config's flags alone, as a user builds one, then run.
#   installcheck.sh PKGCONFIG_DIR LIBDIR SOURCE
# CC and PKG_CONFIG from the environment (make passes the configured ones).
# Exit status 0 when it builds, links and runs; 1 otherwise, saying where.
set -u
pcdir=$1 libdir=$2 src=$3
cc=${CC:-cc}
pkgconfig=${PKG_CONFIG:-pkg-config}
tmp=${TMPDIR:-/tmp}/chorus-installcheck.$$
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp" || exit 1

if [ ! -f "$pcdir/chorus.pc" ]; then
    echo "installcheck: $pcdir/chorus.pc is missing: run make install first" >&2
    exit 1
fi
flags=$(PKG_CONFIG_PATH=$pcdir "$pkgconfig" --cflags --libs chorus) || {
    echo "installcheck: $pkgconfig --cflags --libs chorus failed (PKG_CONFIG_PATH=$pcdir)" >&2
    exit 1
}
echo "installcheck: $cc $src $flags"
# shellcheck disable=SC2086 # the flags are words
if ! $cc -o "$tmp/prog" "$src" $flags >"$tmp/cc.out" 2>&1; then
    cat "$tmp/cc.out" >&2
    echo "installcheck: $(basename "$src") does not build against the installed headers and library" >&2
    exit 1
fi
# The backend modules are found in the installed backend folder.
if ! LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$tmp/prog" >"$tmp/run.out" 2>&1; then
    cat "$tmp/run.out" >&2
    echo "installcheck: the program built against the installed library fails" >&2
    exit 1
fi
cat "$tmp/run.out"
grep -q '^host ' "$tmp/run.out" || {
    echo "installcheck: the program lists no host device" >&2
    exit 1
}
echo "installcheck: passed"
