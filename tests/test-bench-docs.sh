#!/bin/sh
# docs/BENCHMARKS.md keeps its promise: every data row of its tables names
# the date of its measurement (YYYY-MM-DD; a row "not yet measured" has
# none yet) and the one command that reproduces it, in backticks, which
# starts (after VAR=value words, `chrt -f N`, `mpirun` and its options,
# `python3`) with a program of this tree: a benchmark, chorus-train, a
# script of bench/, docs/pytorch/ or tests/gpu/, or make. Every --option
# given to that program must be one its source knows, so a renamed option
# fails here rather than in a reader's shell. Each area the file promises
# has a section with at least one row.
srcdir=${CHORUS_TEST_SRCDIR:-$(dirname "$0")/..}
doc=$srcdir/docs/BENCHMARKS.md

. "$(dirname "$0")/tap.sh"

if [ ! -f "$doc" ]; then
    ok 1 "docs/BENCHMARKS.md exists ($doc)"
    tap_done
fi

tmp=${TMPDIR:-/tmp}/test-bench-docs.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT

# The data rows: after a header row and its | --- | line, every line that
# starts with "|" until the table ends; each as LINE<tab>ROW.
awk '
    /^\|/ && table { printf "%d\t%s\n", NR, $0; next }
    /^\| *:?-+/ && prev ~ /^\|/ { table = 1; prev = $0; next }
    { table = 0; prev = $0 }
' "$doc" >"$tmp/rows"

# The section of each area, and its rows.
for area in "Host training step against PyTorch" "GPU step beside PyTorch" \
    "GEMM against its library" "Collectives and data parallelism" "Memory" "Accuracy"; do
    rows=$(awk -v want="## $area" '
        /^## / { inside = ($0 == want) }
        inside && /^\|/ { n++ }
        END { print n + 0 }
    ' "$doc")
    test "$rows" -ge 3
    ok $? "a section \"$area\" with a table ($rows table lines)"
done

# The source that knows a program's options, or "-" for none to check.
source_of() {
    case $1 in
        _build/bench/bench-*) echo "bench/${1#_build/bench/}.c" ;;
        _build/utils/chorus-train) echo "utils/train-options.c" ;;
        bench/*.sh | docs/pytorch/*.py | tests/gpu/*.sh) echo "$1" ;;
        make) echo "-" ;;
        *) echo "" ;;
    esac
}

# The command of a backticked span: the span less its launchers.
strip_launchers() {
    sed -E -e ':a' \
        -e 's/^[A-Z_][A-Z0-9_]*=("[^"]*"|[^ ]*) +//; ta' \
        -e 's/^chrt +-f +[0-9]+ +//' \
        -e 's#^mpirun( +-{1,2}[a-z-]+( +[^-/ ][^ /]*){0,2})* +##' \
        -e 's/^python3 +//'
}

nrows=0
while IFS="$(printf '\t')" read -r line row; do
    nrows=$((nrows + 1))
    case $row in
        *"not yet measured"*) dated=0 ;;
        *) printf '%s\n' "$row" | grep -Eq '20[0-9]{2}-[01][0-9]-[0-3][0-9]'; dated=$? ;;
    esac
    ok $dated "line $line names the date of its measurement"

    why="no backticked command starting with a program of the tree"
    found=1
    # shellcheck disable=SC2016 # the backquotes are the spans' marks
    printf '%s\n' "$row" | grep -o '`[^`]*`' | tr -d '`' >"$tmp/spans"
    while IFS= read -r span; do
        cmd=$(printf '%s\n' "$span" | strip_launchers)
        prog=${cmd%% *}
        src=$(source_of "$prog")
        [ -n "$src" ] || continue
        if [ "$src" != - ] && [ ! -f "$srcdir/$src" ]; then
            why="$prog: no $src in the tree"
            continue
        fi
        bad=""
        if [ "$src" != - ]; then
            for opt in $(printf '%s\n' "${cmd#"$prog"}" | grep -oE '(^| )--[a-z][a-z0-9-]*' |
                sed 's/^ *--//'); do
                grep -q -e "\"$opt\"" -e "\"--$opt\"" "$srcdir/$src" || bad="$bad --$opt"
            done
        fi
        if [ -z "$bad" ]; then
            found=0
            break
        fi
        why="$prog: $src knows no$bad"
    done <"$tmp/spans"
    if [ "$found" -eq 0 ]; then
        ok 0 "line $line gives the command that reproduces it"
    else
        ok 1 "line $line gives the command that reproduces it: $why"
    fi
done <"$tmp/rows"

test "$nrows" -ge 40
ok $? "the tables hold $nrows rows (at least 40)"
tap_done
