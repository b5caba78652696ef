#!/bin/sh
# The OpenCL op tests on oclgrind's simulated device, which checks every
# access every kernel makes: reads and writes out of bounds, data races
# between the work-items of a group and between work-groups
# (OCLGRIND_DATA_RACES), barriers that only some work-items reach, and
# invalid use of the OpenCL API (OCLGRIND_CHECK_API). Any report, any
# failing test, fails the step. CI runs it; by hand, from a build folder:
#
#     sh ../tests/oclgrind.sh            # every run below
#     sh ../tests/oclgrind.sh ops half   # the runs named
#
# oclgrind is its own ICD here: a folder holding one .icd file that names
# its library, given to the ICD loader as OCL_ICD_VENDORS, so the only
# OpenCL device is the simulator (opencl:0) beside the host, which the op
# tests compare against. The tests take their small sizes
# (CHORUS_TEST_SIZES=small): oclgrind interprets every work-item, and its
# race detector tracks every byte of every live buffer at every launch.
#
# Environment: CHORUS_OCLGRIND_ICD, the ICD library (default
# /usr/lib/oclgrind/liboclgrind-rt-icd.so); CHORUS_OCLGRIND_JOBS, runs at
# once (default: the number of CPUs); CHORUS_OCLGRIND_TIMEOUT, seconds one
# run may take (default 900). The logs go to tests/oclgrind-logs/ in the
# build folder.
# Exit status: 0 clean, 1 a report or a failure, 2 not runnable here.

set -u

icd_lib=${CHORUS_OCLGRIND_ICD:-/usr/lib/oclgrind/liboclgrind-rt-icd.so}
logs=$PWD/tests/oclgrind-logs

# Each run: a name, the test program, then environment assignments; the
# longest first, as the runs are handed out in this order.
# - every op test with the build's GEMM (CLBlast where it was built with
#   it: it runs on oclgrind; test-ops has its single GEMM, test-half its
#   batched one);
# - the GEMMs and the convolutions built on them (test-ops) and the
#   batched GEMM (test-ops-attn) through our own kernels: every
#   transposition, tiles of 16, 32 and 64 chosen by the products' sizes;
# - the device made smaller by oclgrind's own options, so that our kernels
#   take the paths a small device gets: work-groups of at most 16 (the
#   GEMM of 4 x 4 work-items only, reductions in groups of 16) and 1 KiB
#   of local memory (the GEMM without local memory).
all_runs='
attn-own    test-ops-attn  CHORUS_OPENCL_GEMM=own
ops-own     test-ops       CHORUS_OPENCL_GEMM=own
ops         test-ops
attn-wg16   test-ops-attn  CHORUS_OPENCL_GEMM=own OCLGRIND_MAX_WGSIZE=16
half        test-half
attn        test-ops-attn
norm        test-ops-norm
attn-lmem1k test-ops-attn  CHORUS_OPENCL_GEMM=own OCLGRIND_LOCAL_MEM_SIZE=1024
grad        test-ops-grad
norm-wg16   test-ops-norm  OCLGRIND_MAX_WGSIZE=16
cast        test-cast
errors      test-errors
'

if [ ! -x ./tests/test-ops ] || [ ! -x ./utils/chorus-info ]; then
    echo "oclgrind.sh: run it from a build folder after make check TESTS= (no ./tests/test-ops" \
         "or ./utils/chorus-info here)" >&2
    exit 2
fi
if [ ! -f "$icd_lib" ]; then
    echo "oclgrind.sh: $icd_lib not found (Debian: apt-get install oclgrind; or set CHORUS_OCLGRIND_ICD)" >&2
    exit 2
fi

# The runs asked for, by name.
if [ $# -gt 0 ]; then
    runs=
    for want in "$@"; do
        line=$(printf '%s\n' "$all_runs" | awk -v n="$want" '$1 == n')
        if [ -z "$line" ]; then
            echo "oclgrind.sh: no run named $want; the runs:" \
                 "$(printf '%s\n' "$all_runs" | awk 'NF { printf " %s", $1 }')" >&2
            exit 2
        fi
        runs="$runs
$line"
    done
else
    runs=$all_runs
fi

vendors=$(mktemp -d "${TMPDIR:-/tmp}/chorus-oclgrind.XXXXXX") || exit 2
trap 'rm -rf "$vendors"' EXIT
trap 'exit 1' INT TERM
echo "$icd_lib" > "$vendors/oclgrind.icd"
rm -rf "$logs"
mkdir -p "$logs" || exit 2

OCL_ICD_VENDORS=$vendors
CHORUS_DEVICES=host,opencl:0
CHORUS_BACKEND_PATH=$PWD/backends/opencl/.libs
CHORUS_TEST_SIZES=${CHORUS_TEST_SIZES:-small}
OCLGRIND_DATA_RACES=1
OCLGRIND_CHECK_API=1
# Each run is one process; the runs share the CPUs instead.
OCLGRIND_NUM_THREADS=1
export OCL_ICD_VENDORS CHORUS_DEVICES CHORUS_BACKEND_PATH CHORUS_TEST_SIZES \
    OCLGRIND_DATA_RACES OCLGRIND_CHECK_API OCLGRIND_NUM_THREADS
# The uninitialised-value plugin stays off: oclgrind 21.10 aborts on LLVM's
# freeze instruction ("Unsupported instruction: freeze"), which the
# compiler emits for our kernels.
unset OCLGRIND_UNINITIALIZED
# Our own limits are left to the make check tests (opencl-limits.sh).
unset CHORUS_OPENCL_MAX_WORK_GROUP CHORUS_OPENCL_LOCAL_MEM

# The simulator must be opencl:0, or the tests would pass on the host
# alone (they skip a backend that has no device).
info=$(./utils/chorus-info 2>&1)
if ! printf '%s\n' "$info" | grep -q '^ *opencl:0 .*Oclgrind'; then
    echo "oclgrind.sh: opencl:0 is not oclgrind's simulator; chorus-info says:" >&2
    printf '%s\n' "$info" >&2
    exit 2
fi

jobs=${CHORUS_OCLGRIND_JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}
limit=${CHORUS_OCLGRIND_TIMEOUT:-900}
timeout_cmd=
if command -v timeout >/dev/null 2>&1; then
    timeout_cmd="timeout $limit"
fi

# One run: stdout (TAP) to NAME.tap, stderr (where oclgrind reports) to
# NAME.err, the exit status and seconds to NAME.rc and NAME.time.
run_one() {
    name=$1 prog=$2
    shift 2
    start=$(date +%s)
    env "$@" $timeout_cmd "./tests/$prog" < /dev/null > "$logs/$name.tap" 2> "$logs/$name.err"
    echo $? > "$logs/$name.rc"
    echo $(($(date +%s) - start)) > "$logs/$name.time"
}

# CHORUS_OCLGRIND_JOBS lanes, each taking the next run nobody has taken
# (mkdir is atomic: the lane that makes the run's folder runs it).
start=$(date +%s)
printf '%s\n' "$runs" | awk 'NF' > "$logs/runs"
lane=0
while [ "$lane" -lt "$jobs" ]; do
    (
        while read -r name prog vars; do
            mkdir "$logs/$name.taken" 2>/dev/null || continue
            # shellcheck disable=SC2086 # vars: assignments split on purpose
            run_one "$name" "$prog" $vars
            echo "oclgrind: $name done ($(cat "$logs/$name.time") s)"
        done < "$logs/runs"
    ) &
    lane=$((lane + 1))
done
wait
elapsed=$(($(date +%s) - start))

# oclgrind's reports begin with one of these lines (its error and
# warning messages, and the API checker's), each followed by indented
# lines: the kernel, the work-items, the instruction and its source line.
heads='^(Invalid |Read-write data race|Write-write data race|Work-group divergence|Work-item divergence|Uninitialized|Unaligned address|Undefined external|Unsupported |Arithmetic exception|Oclgrind)'

runs_n=0 passed=0 failed=0 reports=0 other=0 bad_runs=
while read -r name prog vars; do
    runs_n=$((runs_n + 1))
    tap=$logs/$name.tap err=$logs/$name.err
    rc=$(cat "$logs/$name.rc" 2>/dev/null || echo 1)
    p=$(grep -c '^ok ' "$tap")
    f=$(grep -c '^not ok ' "$tap")
    # Lines about the simulator (CHORUS_DEVICES is quoted in messages).
    on_sim=$(grep '^ok ' "$tap" | grep -v 'CHORUS_DEVICES=' | grep -c 'opencl:0')
    r=$(grep -Ec "$heads" "$err")
    # Any other line on stderr fails the run too: the tests write nothing
    # there, so anything is worth a look.
    o=$(grep -Evc "$heads|^[[:space:]]|^\$" "$err")
    passed=$((passed + p)) failed=$((failed + f)) reports=$((reports + r)) other=$((other + o))
    why=
    [ "$rc" -ne 0 ] && why="$why exit status $rc;"
    [ "$rc" -eq 124 ] && why="$why over $limit s;"
    [ "$f" -ne 0 ] && why="$why $f failed;"
    [ "$on_sim" -eq 0 ] && why="$why nothing ran on opencl:0;"
    [ "$r" -ne 0 ] && why="$why $r oclgrind reports;"
    [ "$o" -ne 0 ] && why="$why $o other lines on stderr;"
    echo "oclgrind: $name (tests/$prog${vars:+ $vars}): $p passed, $f failed," \
         "$r reports, $(cat "$logs/$name.time") s${why:+ -- FAILED:$why}"
    if [ -n "$why" ]; then
        bad_runs="$bad_runs $name"
        grep '^not ok ' "$tap" | head -20 | sed "s/^/  $name: /"
        if [ -s "$err" ]; then
            echo "  $name: stderr (the first 200 lines of $err):"
            head -200 "$err" | sed "s/^/  $name! /"
        fi
    fi
done < "$logs/runs"

echo "oclgrind: $runs_n runs, $passed passed, $failed failed, $reports reports," \
     "$other other stderr lines, ${elapsed} s${bad_runs:+; failed runs:$bad_runs}"
[ -z "$bad_runs" ]
