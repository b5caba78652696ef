#!/usr/bin/env bash
# Build Chorus with its CUDA backend on an NVIDIA GPU machine, run the CUDA
# tests and benchmarks, and print a table. One call, a few minutes.
#
#   tests/gpu/check.sh OUTDIR
#
# Made for a machine with a driver, nvcc, cuBLAS and NCCL but none of
# Debian's -dev packages (no autotools, hwloc, OpenBLAS, jansson or zlib
# headers) and no network. So it does not run configure: it compiles the
# core (lib/), the host backend, the CUDA module, the tests and the
# benchmarks directly with gcc and nvcc, in a build folder outside the
# tree. Of nn/, the checkpoints and the IDX data sets are left out (they
# need jansson and zlib): the layers, optimizers and data parallelism are
# in; so are hwloc and OpenBLAS left out (the host backend uses its blocked
# C GEMM). cuBLAS and NCCL come
# from the CUDA toolkit or else from Python packages (nvidia-cublas,
# nvidia-nccl); without NCCL the module uses its peer-copy all-reduce.
#
# OUTDIR receives seven files: summary.txt, probe.log, build.log,
# test-cuda.log, test-ops.log, tests-more.log, bench.log. Every step runs
# even when an earlier one failed (as far as it can); the exit status is 0
# only when every step passed.
#
# Environment: CUDA_ARCH (default: the first GPU's compute capability, as
# "90"), CHECK_BUILD (build folder, default /tmp/chorus-gpu-check),
# CHECK_BUDGET (seconds for the whole run, default 540: steps are cut short
# so that the script ends in time). Every source compiles in parallel.
set -u

if [ $# -ne 1 ]; then
    echo "usage: tests/gpu/check.sh OUTDIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 2
outdir=$(cd "$1" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
B=${CHECK_BUILD:-/tmp/chorus-gpu-check}
BUDGET=${CHECK_BUDGET:-540}
START=$(date +%s)
SUMMARY="$outdir/summary.txt"
FAILED=0
ROWS=()

log() { printf '%s\n' "$*"; }
elapsed() { echo $(($(date +%s) - START)); }

# Seconds a step may take: its own limit, or what is left of the budget.
limit() {
    local left=$((BUDGET - $(elapsed) - 15))
    [ "$left" -lt 1 ] && left=1
    [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}

row() { # step result seconds detail
    ROWS+=("$(printf '%-16s %-7s %5s  %s' "$1" "$2" "$3" "$4")")
    [ "$2" = ok ] || [ "$2" = skipped ] || FAILED=1
}

# TAP counts of a log: "N ok, N not ok, N skipped".
tap_counts() {
    local ok notok skip
    ok=$(grep -c '^ok ' "$1" 2>/dev/null)
    notok=$(grep -c '^not ok ' "$1" 2>/dev/null)
    skip=$(grep -ci '^ok .*# skip' "$1" 2>/dev/null)
    echo "${ok:-0} ok, ${notok:-0} not ok, ${skip:-0} skipped"
}

# ---- probe ------------------------------------------------------------------

NVCC=""
CUDA_HOME=""
CUDA_INCS=()     # -I folders for cuBLAS / NCCL headers outside the toolkit
CUBLAS_SO=""
CUBLASLT_SO=""
NCCL_SO=""
NCCL_INC=""
CUDART=""
LIBDIRS=""

FOUND=""

# pick regex candidates...: the first candidate that exists, else the first
# path found on the machine that matches regex.
pick() {
    local re=$1
    shift
    first_of "$@" && return 0
    printf '%s\n' "$FOUND" | grep -m 1 -- "$re"
}

first_of() { # first existing file among the arguments
    local f
    for f in "$@"; do
        [ -e "$f" ] && { echo "$f"; return 0; }
    done
    return 1
}

# Every place the libraries and headers may live, in one walk: the toolkit,
# the system, and Python packages (pip's nvidia-* wheels put them under
# site-packages/nvidia).
find_all() {
    timeout "$(limit 90)" find / -xdev \( -path /proc -o -path /sys -o -path /dev \) -prune \
        -o \( -name 'libcublas.so*' -o -name 'libcublasLt.so*' -o -name 'libnccl.so*' \
        -o -name 'libcudart*' -o -name cublas_v2.h -o -name nccl.h \) -print 2>/dev/null | sort
}

probe() {
    log "== date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), host: $(uname -n), $(uname -srm)"
    log "== source: $SRC"
    log "== nvidia-smi"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi
        nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version,pci.bus_id \
            --format=csv
    else
        log "nvidia-smi: not found"
    fi
    NVCC=$(command -v nvcc || first_of /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc)
    log "== nvcc: ${NVCC:-not found}"
    if [ -n "$NVCC" ]; then
        "$NVCC" --version
        CUDA_HOME=$(cd "$(dirname "$NVCC")/.." && pwd)
    fi
    log "== gcc: $(gcc --version 2>&1 | head -n 1)"
    log "== python: $(python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -n 1)"
    log "== libraries and headers found"
    FOUND=$(find_all)
    printf '%s\n' "$FOUND"
    local tk="$CUDA_HOME" cublas_h
    CUBLAS_SO=$(pick '/libcublas\.so\.[0-9]*$' "$tk"/lib64/libcublas.so.[0-9]* \
        "$tk"/targets/*/lib/libcublas.so.[0-9]*)
    CUBLASLT_SO=$(pick '/libcublasLt\.so\.[0-9]*$' \
        "$(dirname "${CUBLAS_SO:-/none}")"/libcublasLt.so.[0-9]*)
    cublas_h=$(pick '/cublas_v2\.h$' "$tk"/include/cublas_v2.h "$tk"/targets/*/include/cublas_v2.h)
    [ -n "$cublas_h" ] && CUDA_INCS+=("-I$(dirname "$cublas_h")")
    NCCL_SO=$(pick '/libnccl\.so\.[0-9]*$' "$tk"/lib64/libnccl.so.[0-9]*)
    NCCL_INC=$(pick '/nccl\.h$' "$tk"/include/nccl.h /usr/include/nccl.h)
    [ -n "$NCCL_INC" ] && CUDA_INCS+=("-I$(dirname "$NCCL_INC")")
    # Static cudart needs only the driver at run time; the Python wheels
    # ship only the shared one.
    CUDART=$(pick '/libcudart\.so\.[0-9]*$' "$tk"/lib64/libcudart_static.a \
        "$tk"/targets/*/lib/libcudart_static.a "$tk"/lib64/libcudart.so.[0-9]*)
    local f
    for f in "$CUBLAS_SO" "$CUBLASLT_SO" "$NCCL_SO" "$CUDART"; do
        [ -n "$f" ] && LIBDIRS="$LIBDIRS:$(dirname "$f")"
    done
    if [ -z "${CUDA_ARCH:-}" ]; then
        CUDA_ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
            head -n 1 | tr -d ' .')
        CUDA_ARCH=${CUDA_ARCH:-90}
    fi
    log "== chosen: nvcc $NVCC, arch sm_$CUDA_ARCH"
    log "   cuBLAS $CUBLAS_SO ($CUBLASLT_SO), headers ${cublas_h:-none}"
    log "   NCCL ${NCCL_SO:-none}, header ${NCCL_INC:-none}"
    log "   cudart $CUDART"
    [ -n "$NVCC" ] && [ -n "$CUBLAS_SO" ] && [ -n "$cublas_h" ] && [ -n "$CUDART" ]
}

# ---- build ------------------------------------------------------------------

CFLAGS_C=(-std=gnu11 -O2 -g -Wall -Wextra -fPIC -fvisibility=hidden -fopenmp -pthread)
BUILT=()

compile_c() { # output source...: one program or object, logged
    log "gcc -o $*"
    gcc "${CFLAGS_C[@]}" -I"$B" -I"$SRC/include" -I"$SRC/lib" -I"$SRC/backends/host" "$@"
}

build_core() {
    mkdir -p "$B/obj" "$B/mod" "$B/cuda" || return 1
    local version
    version=$(sed -n 's/^AC_INIT(\[[^]]*\], *\[\([^]]*\)\].*/\1/p' "$SRC/configure.ac")
    printf '#define PACKAGE_VERSION "%s"\n#define VERSION "%s"\n' "${version:-0.0.0}" \
        "${version:-0.0.0}" >"$B/config.h"
    local f pids=() objs=() rc=0
    for f in "$SRC"/lib/*.c "$SRC"/backends/host/*.c "$SRC"/nn/module.c "$SRC"/nn/optim.c \
        "$SRC"/nn/presets.c "$SRC"/nn/dp.c; do
        local o
        o="$B/obj/$(basename "$(dirname "$f")")-$(basename "$f" .c).o"
        objs+=("$o")
        compile_c -DHAVE_CONFIG_H "-DCH_BACKEND_DIR=\"$B/mod\"" -c -o "$o" "$f" &
        pids+=($!)
    done
    for f in "${pids[@]}"; do wait "$f" || rc=1; done
    [ $rc -eq 0 ] || return 1
    log "gcc -shared -o $B/libchorus.so.0"
    gcc -shared -fopenmp -pthread -Wl,-soname,libchorus.so.0 -o "$B/libchorus.so.0" "${objs[@]}" \
        -lm -ldl || return 1
    ln -sf libchorus.so.0 "$B/libchorus.so"
}

build_module() {
    local nccl_def=() nccl_lib=()
    if [ -n "$NCCL_SO" ] && [ -n "$NCCL_INC" ]; then
        nccl_def=(-DCH_HAVE_NCCL=1)
        nccl_lib=("$NCCL_SO")
    fi
    local f pids=() rc=0
    for f in "$SRC"/backends/cuda/*.cu; do
        local o
        o="$B/cuda/$(basename "$f" .cu).o"
        log "nvcc -o $o $f"
        "$NVCC" -gencode="arch=compute_$CUDA_ARCH,code=sm_$CUDA_ARCH" -std=c++20 -O3 --fmad=false \
            -Xcompiler=-fPIC -Xcompiler=-Wall,-Wextra,-fvisibility=hidden \
            -I"$SRC/include" -I"$SRC/lib" "${CUDA_INCS[@]}" "${nccl_def[@]}" -c -o "$o" "$f" &
        pids+=($!)
    done
    for f in "${pids[@]}"; do wait "$f" || rc=1; done
    [ $rc -eq 0 ] || return 1
    log "g++ -shared -o $B/mod/chorus-cuda.so (NCCL: ${nccl_lib[*]:-no})"
    g++ -shared -o "$B/mod/chorus-cuda.so" "$B"/cuda/*.o -L"$B" -lchorus "$CUBLAS_SO" \
        "${nccl_lib[@]}" "$CUDART" -ldl -lrt -lpthread -lstdc++ || return 1
    nm -D --defined-only "$B/mod/chorus-cuda.so" | grep -q ' chorus_backend_entry$' ||
        { log "chorus-cuda.so does not export chorus_backend_entry"; return 1; }
}

build_programs() {
    local rc=0 t
    local util=("$SRC/tests/tap.c")
    [ -f "$SRC/tests/ref.c" ] && util+=("$SRC/tests/ref.c")
    for t in test-core test-cuda test-ops test-ops-grad test-errors test-reduce test-dp; do
        [ -f "$SRC/tests/$t.c" ] || continue
        local defs=()
        # As in tests/cuda.mk: the module was built, so it must load.
        [ "$t" = test-cuda ] && defs=(-DCH_TEST_HAVE_CUDA=1)
        if compile_c "${defs[@]}" -I"$SRC/tests" -o "$B/$t" "$SRC/tests/$t.c" "${util[@]}" \
            -L"$B" -lchorus -lm; then
            BUILT+=("$t")
        else
            rc=1
        fi
    done
    if compile_c -o "$B/chorus-info" "$SRC/utils/chorus-info.c" -L"$B" -lchorus; then
        BUILT+=(chorus-info)
    else
        rc=1
    fi
    if [ -f "$SRC/bench/bench-ops.c" ]; then
        if compile_c -o "$B/bench-ops" "$SRC/bench/bench-ops.c" -L"$B" -lchorus -lm; then
            BUILT+=(bench-ops)
        else
            rc=1
        fi
    fi
    for t in bench-allreduce bench-dp; do
        [ -f "$SRC/bench/$t.c" ] || continue
        if compile_c -o "$B/$t" "$SRC/bench/$t.c" -L"$B" -lchorus -lm; then
            BUILT+=("$t")
        else
            rc=1
        fi
    done
    if compile_c "${CUDA_INCS[@]}" -I"$CUDA_HOME/include" -o "$B/bench-cublas" \
        "$SRC/bench/bench-cublas.c" -L"$B" -lchorus "$CUBLAS_SO" "$CUDART" -ldl -lrt -lm -lstdc++; then
        BUILT+=(bench-cublas)
    else
        rc=1
    fi
    return $rc
}

build() {
    rm -rf "$B" && mkdir -p "$B" || return 1
    build_core || { log "BUILD FAILED: libchorus"; return 1; }
    local rc=0
    build_module || { log "BUILD FAILED: chorus-cuda.so"; rc=1; }
    build_programs || { log "BUILD FAILED: some programs"; rc=1; }
    log "built: ${BUILT[*]:-nothing}"
    return $rc
}

built() { # name: was it built?
    local p
    for p in "${BUILT[@]:-}"; do [ "$p" = "$1" ] && return 0; done
    return 1
}

# ---- run --------------------------------------------------------------------

# run_tap step log program [args]: a TAP program under a time limit, its
# output appended to `log`.
run_tap() {
    local step=$1 logf=$2 prog=$3
    shift 3
    if ! built "$prog"; then
        row "$step" skipped 0 "not built"
        return
    fi
    local t0 rc secs lim own="$B/$prog.out"
    lim=$(limit 240)
    t0=$(date +%s)
    timeout "$lim" "$B/$prog" "$@" >"$own" 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
    { echo "== $prog $* (limit ${lim}s, exit $rc, ${secs}s)"; cat "$own"; } >>"$logf"
    local counts
    counts=$(tap_counts "$own")
    if [ $rc -eq 124 ]; then
        row "$step" TIMEOUT "$secs" "after ${lim}s; $counts"
    elif [ $rc -ne 0 ]; then
        row "$step" FAILED "$secs" "exit $rc; $counts"
    else
        row "$step" ok "$secs" "$counts"
    fi
    grep '^not ok' "$own" | head -n 20 >>"$outdir/failures.tmp"
}

run_prog() { # step log program [args]: a plain program, exit status decides
    local step=$1 logf=$2 prog=$3
    shift 3
    if ! built "$prog"; then
        row "$step" skipped 0 "not built"
        return
    fi
    local t0 rc lim own="$B/$prog.out"
    lim=$(limit 180)
    t0=$(date +%s)
    timeout "$lim" "$B/$prog" "$@" >"$own" 2>&1
    rc=$?
    { echo "== $prog $* (limit ${lim}s, exit $rc)"; cat "$own"; } >>"$logf"
    local detail="exit $rc"
    [ "$prog" = bench-cublas ] && [ $rc -eq 0 ] &&
        detail=$(awk '$1 ~ /^[0-9]+$/ { printf "n=%s ratio %s; ", $1, $5 }' "$own")
    [ $rc -eq 124 ] && detail="timed out after ${lim}s"
    row "$step" "$([ $rc -eq 0 ] && echo ok || echo FAILED)" "$(($(date +%s) - t0))" "$detail"
}

main() {
    local t0 secs
    : >"$outdir/failures.tmp"

    t0=$(date +%s)
    if probe >"$outdir/probe.log" 2>&1; then
        row probe ok $(($(date +%s) - t0)) "sm_$CUDA_ARCH, NCCL: $([ -n "$NCCL_SO" ] && echo yes || echo no)"
    else
        row probe FAILED $(($(date +%s) - t0)) "no nvcc, cuBLAS or cudart: see probe.log"
    fi

    t0=$(date +%s)
    if [ -z "$NVCC" ] || [ -z "$CUBLAS_SO" ] || [ -z "$CUDART" ]; then
        row build skipped 0 "nothing to build with"
    elif build >"$outdir/build.log" 2>&1; then
        row build ok $(($(date +%s) - t0)) "${BUILT[*]}"
    else
        row build FAILED $(($(date +%s) - t0)) "see build.log; built: ${BUILT[*]:-nothing}"
    fi

    export CHORUS_BACKEND_PATH="$B/mod"
    export LD_LIBRARY_PATH="$B$LIBDIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    unset CHORUS_DEVICES
    log "CHORUS_BACKEND_PATH=$CHORUS_BACKEND_PATH" >>"$outdir/tests-more.log"
    log "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >>"$outdir/tests-more.log"

    run_prog chorus-info "$outdir/tests-more.log" chorus-info
    run_tap test-cuda "$outdir/test-cuda.log" test-cuda
    run_tap test-ops "$outdir/test-ops.log" test-ops
    run_tap test-core "$outdir/tests-more.log" test-core
    run_tap test-errors "$outdir/tests-more.log" test-errors
    run_tap test-ops-grad "$outdir/tests-more.log" test-ops-grad
    run_prog bench-cublas "$outdir/bench.log" bench-cublas 1024 2048 4096
    run_prog bench-ops "$outdir/bench.log" bench-ops --devices cuda:0 --sizes 1024,4096
    run_tap test-reduce "$outdir/tests-more.log" test-reduce
    run_tap test-dp "$outdir/tests-more.log" test-dp
    run_prog bench-allreduce "$outdir/bench.log" bench-allreduce --devices cuda:0,cuda:0,cuda:0 \
        --max-mb 256
    run_prog bench-dp "$outdir/bench.log" bench-dp --devices cuda:0,host --model cnn

    {
        log "Chorus GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), $(elapsed) s"
        log "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
        printf '%-16s %-7s %5s  %s\n' step result secs detail
        printf '%s\n' "${ROWS[@]}"
        if [ -s "$outdir/failures.tmp" ]; then
            log ""
            log "First failures:"
            cat "$outdir/failures.tmp"
        fi
        if [ -f "$B/bench-cublas.out" ]; then
            log ""
            cat "$B/bench-cublas.out"
        fi
    } >"$SUMMARY"
    rm -f "$outdir/failures.tmp"
    cat "$SUMMARY"
    return $FAILED
}

main
