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
mpirun_tap 2 "2 ranks ($devices)" "$tmp/out" "$tmp/err" "$prog" --ranks "$tmp" "$devices"
tap_done
