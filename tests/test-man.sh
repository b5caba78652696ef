#!/bin/sh
# The man pages of the installed programs against the programs: every long
# option a program's --help lists is in its page's OPTIONS, and OPTIONS
# holds none that --help lacks; each page renders with man -l without a
# warning (tests/man-render.sh).
srcdir=${CHORUS_TEST_SRCDIR:-$(dirname "$0")/..}
builddir=${CHORUS_TEST_BUILDDIR:-.}
tmp=${TMPDIR:-/tmp}/test-man.$$
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

. "$(dirname "$0")/tap.sh"

# The long options of --help on stdin, one a line, sorted: from each line
# that starts (after spaces) with a dash, the part before the first run of
# two spaces, which is the options and their arguments, not their meaning.
help_options() {
    sed -n 's/^ \{1,\}\(-.*\)$/\1/p' | sed 's/  .*//' |
        grep -o -- '--[a-z0-9][a-z0-9-]*' | sort -u
}

# The long options the man page $1 lists: the tag line after each .TP in
# its OPTIONS section, with roff's \- as a dash.
page_options() {
    awk '/^\.SH / { in_options = ($2 == "OPTIONS") }
         in_options && tag { print; tag = 0 }
         in_options && /^\.TP/ { tag = 1 }' "$1" |
        sed 's/\\-/-/g' | grep -o -- '--[a-z0-9][a-z0-9-]*' | sort -u
}

# Every page of man/ (configure writes man/PROG.1 from man/PROG.1.in), and
# its program: built, or a script of the sources (chorus-elastic).
for src in "$srcdir"/man/*.1.in; do
    prog=${src##*/}
    prog=${prog%.1.in}
    bin=$builddir/utils/$prog
    [ -f "$bin" ] || bin=$srcdir/utils/$prog
    page=$builddir/man/$prog.1
    if ! "$bin" --help >"$tmp/help" 2>&1; then
        ok 1 "$prog --help exits 0: $(head -c 300 "$tmp/help" | tr '\n#' '  ')"
        continue
    fi
    if [ ! -f "$page" ]; then
        ok 1 "$page exists (configure writes it from man/$prog.1.in)"
        continue
    fi
    help_options <"$tmp/help" >"$tmp/help.opts"
    page_options "$page" >"$tmp/page.opts"
    count=$(wc -l <"$tmp/help.opts")
    test "$count" -gt 0
    ok $? "$prog --help lists long options ($count)"
    missing=$(comm -23 "$tmp/help.opts" "$tmp/page.opts" | paste -sd' ' -)
    test -z "$missing"
    ok $? "$prog.1's OPTIONS has every option of --help (missing: ${missing:-none})"
    extra=$(comm -13 "$tmp/help.opts" "$tmp/page.opts" | paste -sd' ' -)
    test -z "$extra"
    ok $? "$prog --help has every option of $prog.1's OPTIONS (missing: ${extra:-none})"

    sh "$srcdir/tests/man-render.sh" "$builddir/man" "$prog.1" >"$tmp/render" 2>&1
    status=$?
    if [ "$status" -eq 77 ]; then
        skip "$(tr '\n#' '  ' <"$tmp/render")"
    else
        ok $status "$(tr '\n#' '  ' <"$tmp/render")"
    fi
done

tap_done
