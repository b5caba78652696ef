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
