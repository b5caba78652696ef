#!/bin/sh
# The timeline across processes: tests/test-timeline --ranks under mpirun
# with 2 ranks (host; a PoCL device, or host; host where the OpenCL backend
# is not built), each writing its own trace, which rank 0 reads back:
# each rank's tracks, one time base. Rank 0's TAP lines are this script's.
builddir=${CHORUS_TEST_BUILDDIR:-.}
prog=$builddir/tests/test-timeline
mpirun=${CHORUS_MPIRUN:-}
tmp=${TMPDIR:-/tmp}/test-timeline-mpi.$$
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

if [ -z "$mpirun" ]; then
    echo "1..0 # SKIP built without MPI, or no mpirun was found (./configure --with-mpi)"
    exit 0
fi

. "$(dirname "$0")/tap.sh"

if "$builddir/utils/chorus-info" 2>/dev/null | grep -q '^  opencl:0 '; then
    devices="host;opencl:0"
else
    devices="host;host"
fi
CHORUS_DIST_TIMEOUT=${CHORUS_DIST_TIMEOUT:-60}
export CHORUS_DIST_TIMEOUT
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
LSAN_OPTIONS=${LSAN_OPTIONS:-}
export ASAN_OPTIONS LSAN_OPTIONS
timeout 900 "$mpirun" --allow-run-as-root --oversubscribe -x ASAN_OPTIONS -x LSAN_OPTIONS \
    -x CHORUS_DIST_TIMEOUT -np 2 "$prog" --ranks "$tmp" "$devices" >"$tmp/out" 2>"$tmp/err"
status=$?
planned=$(sed -n 's/^1\.\.\([0-9]*\)$/\1/p' "$tmp/out")
while IFS= read -r line; do
    case $line in
        "not ok "*) ok 1 "2 ranks ($devices): ${line#not ok * - }" ;;
        "ok "*"# SKIP"*) skip "2 ranks ($devices): ${line#*# SKIP }" ;;
        "ok "*) ok 0 "2 ranks ($devices): ${line#ok * - }" ;;
        "#"*) echo "$line" ;;
    esac
done <"$tmp/out"
why=""
[ "$status" -eq 0 ] || why="; stderr: $(tail -c 600 "$tmp/err" | tr '\n#' '  ')"
ok $status "mpirun -np 2 exits 0 (status $status$why)"
test "${planned:-0}" -gt 0
ok $? "rank 0 wrote a whole TAP stream (plan 1..${planned:-none})"
tap_done
