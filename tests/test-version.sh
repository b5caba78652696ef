#!/bin/sh
# One version: configure.ac's AC_INIT is the source, and the pkg-config
# file, `chorus-info --version` (which prints the library's ch_version()),
# `chorus-train --version`, the CHORUS_VERSION_* macros of chorus.h, the
# first release heading of NEWS and the .TH line of every man page say the
# same.
srcdir=${CHORUS_TEST_SRCDIR:-$(dirname "$0")/..}
builddir=${CHORUS_TEST_BUILDDIR:-.}

. "$(dirname "$0")/tap.sh"

want=$(sed -n 's/^AC_INIT(\[[^]]*\], *\[\([^]]*\)\].*/\1/p' "$srcdir/configure.ac")
case $want in
[0-9]*.[0-9]*.[0-9]*) ok 0 "configure.ac's AC_INIT gives the version $want" ;;
*) ok 1 "configure.ac's AC_INIT gives a version: got \"$want\"" ;;
esac

# `same WHAT GOT`: one claim that GOT is $want.
same() {
    test "$2" = "$want"
    ok $? "$1 says $want: got \"$2\""
}

same "chorus.pc" "$(sed -n 's/^Version: *//p' "$builddir/chorus.pc")"
out=$("$builddir/utils/chorus-info" --version 2>&1)
same "chorus-info --version (ch_version)" "${out##* }"
out=$("$builddir/utils/chorus-train" --version 2>&1)
same "chorus-train --version" "${out##* }"
macros=$(for part in MAJOR MINOR PATCH; do
    sed -n "s/^#define CHORUS_VERSION_$part \([0-9]*\)\$/\1/p" "$srcdir/include/chorus.h"
done | paste -sd. -)
same "chorus.h's CHORUS_VERSION_MAJOR, _MINOR and _PATCH" "$macros"
# NEWS's headings: "Chorus X.Y.Z (DATE)".
same "NEWS's first heading" "$(sed -n 's/^Chorus \([0-9][^ ]*\) .*/\1/p' "$srcdir/NEWS" | head -n 1)"
for src in "$srcdir"/man/*.1.in; do
    page=${src##*/}
    page=man/${page%.in}
    same "$page's .TH line" "$(sed -n 's/^\.TH .*"Chorus \([0-9][^"]*\)".*/\1/p' "$builddir/$page")"
done

tap_done
