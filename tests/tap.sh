# TAP for the shell tests, sourced by them: `ok STATUS MESSAGE` for each
# claim (STATUS 0 passes), `skip REASON` for one that cannot be checked
# here, and `tap_done` at the end (the plan, and a non-zero exit after any
# failure).
n=0
failed=0

ok() {
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then
        echo "ok $n - $2"
    else
        echo "not ok $n - $2"
        failed=1
    fi
}

skip() {
    n=$((n + 1))
    echo "ok $n # SKIP $1"
}

tap_done() {
    echo "1..$n"
    exit $failed
}

# `mpirun_tap NP WHAT OUT ERR PROGRAM ARGS...`: PROGRAM under mpirun with NP
# ranks, its stdout in OUT and stderr in ERR; rank 0's TAP lines become
# this script's, prefixed with WHAT, then two claims: mpirun exited 0, and
# rank 0 wrote a whole TAP stream. mpirun is $mpirun; ASAN_OPTIONS,
# LSAN_OPTIONS and CHORUS_DIST_TIMEOUT go to every rank.
mpirun_tap() {
    np=$1 what=$2 out=$3 err=$4
    shift 4
    timeout 900 "$mpirun" --allow-run-as-root --oversubscribe -x ASAN_OPTIONS -x LSAN_OPTIONS \
        -x CHORUS_DIST_TIMEOUT -np "$np" "$@" >"$out" 2>"$err"
    status=$?
    planned=$(sed -n 's/^1\.\.\([0-9]*\)$/\1/p' "$out")
    while IFS= read -r line; do
        case $line in
            "not ok "*) ok 1 "$what: ${line#not ok * - }" ;;
            "ok "*"# SKIP"*) skip "$what: ${line#*# SKIP }" ;;
            "ok "*) ok 0 "$what: ${line#ok * - }" ;;
            "#"*) echo "$line" ;;
        esac
    done <"$out"
    why=""
    [ "$status" -eq 0 ] || why="; stderr: $(tail -c 600 "$err" | tr '\n#' '  ')"
    ok $status "mpirun -np $np exits 0 (status $status$why)"
    test "${planned:-0}" -gt 0
    ok $? "rank 0 of $np wrote a whole TAP stream (plan 1..${planned:-none})"
}
