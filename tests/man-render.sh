#!/bin/sh
# Man pages render with man-db's `man -l` at 80 columns without a warning
# (every groff warning on, -ww).
#   man-render.sh DIR PAGE...
# checks DIR/PAGE for each PAGE (its file name: a leading folder is
# dropped, so `man/chorus-info.1` names DIR/chorus-info.1). One line per
# page; exit status 0 when every page is there and renders clean, 1
# otherwise, 77 when man is missing.
set -u
dir=$1
shift
if ! command -v man >/dev/null 2>&1; then
    echo "man-render: man is missing: the pages are not rendered"
    exit 77
fi
tmp=${TMPDIR:-/tmp}/chorus-man-render.$$
trap 'rm -f "$tmp"' EXIT
status=0
for page in "$@"; do
    file=$dir/${page##*/}
    if [ ! -f "$file" ]; then
        echo "man-render: $file is missing"
        status=1
        continue
    fi
    # man-db's seccomp sandbox can fail inside containers; the page is ours.
    MAN_DISABLE_SECCOMP=1 MANWIDTH=80 man --warnings=w -l "$file" >/dev/null 2>"$tmp"
    rc=$?
    if [ "$rc" -ne 0 ] || [ -s "$tmp" ]; then
        echo "man-render: $file: man -l (exit $rc) says: $(head -c 600 "$tmp" | tr '\n' ' ')"
        status=1
    else
        echo "man-render: $file renders without warnings"
    fi
done
exit $status
