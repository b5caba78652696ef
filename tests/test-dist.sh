#!/bin/sh
# Data parallelism across processes: tests/test-dist under mpirun, with 2
# ranks (host; a PoCL device) and with 3 (host; a PoCL device; host and the
# other PoCL device), or host only where the OpenCL backend is not built.
# Rank 0's TAP lines are renumbered into this script's.
builddir=${CHORUS_TEST_BUILDDIR:-.}
prog=$builddir/tests/test-dist
mpirun=${CHORUS_MPIRUN:-}
tmp=${TMPDIR:-/tmp}/test-dist.$$
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

if [ -z "$mpirun" ]; then
    echo "1..0 # SKIP built without MPI, or no mpirun was found (./configure --with-mpi)"
    exit 0
fi

. "$(dirname "$0")/tap.sh"

if "$builddir/utils/chorus-info" 2>/dev/null | grep -q '^  opencl:1 '; then
    two="host;opencl:0"
    three="host;opencl:0;host,opencl:1"
else
    two="host;host"
    three="host;host;host,host"
fi

# As root Open MPI wants --allow-run-as-root; two cores, more ranks:
# --oversubscribe. Each run is bounded: a hang is a failure, not a stall,
# and the watchdog is short so that a lost collective shows in seconds.
CHORUS_DIST_TIMEOUT=${CHORUS_DIST_TIMEOUT:-30}
export CHORUS_DIST_TIMEOUT
run() {
    np=$1 devices=$2
    timeout 900 "$mpirun" --allow-run-as-root --oversubscribe -np "$np" "$prog" "$devices" \
        >"$tmp/out" 2>"$tmp/err"
    status=$?
    planned=$(sed -n 's/^1\.\.\([0-9]*\)$/\1/p' "$tmp/out")
    while IFS= read -r line; do
        case $line in
            "not ok "*) ok 1 "$np ranks ($devices): ${line#not ok * - }" ;;
            "ok "*"# SKIP"*) skip "$np ranks ($devices): ${line#*# SKIP }" ;;
            "ok "*) ok 0 "$np ranks ($devices): ${line#ok * - }" ;;
            "#"*) echo "$line" ;;
        esac
    done <"$tmp/out"
    why=""
    [ "$status" -eq 0 ] || why="; stderr: $(tail -c 600 "$tmp/err" | tr '\n#' '  ')"
    ok $status "mpirun -np $np exits 0 (status $status$why)"
    test "${planned:-0}" -gt 0
    ok $? "rank 0 of $np wrote a whole TAP stream (plan 1..${planned:-none})"
}

run 2 "$two"
run 3 "$three"
tap_done
