#!/usr/bin/env bash
# The GPU check: build Chorus with its CUDA backend on an NVIDIA machine,
# run every CUDA test, the benchmarks and one epoch of training, and write
# what came out to OUTDIR/summary.txt. One run, within a time budget.
#
#   tests/gpu/check.sh OUTDIR
#
# docs/GPU_CHECK.md says how to prepare it, run it and read the summary.
#
# Made for a machine with a driver, nvcc, gcc and python3 (whose pip
# packages may bring cuBLAS and NCCL) but none of Debian's -dev packages
# and no network. So no configure: every .c of lib/, backends/host/ and
# nn/ and every .cu of backends/cuda/ is compiled by hand (globbed, so that
# files added or renamed need no change here), as a test build: every
# symbol visible and the test hooks in (CHI_TEST_HOOKS); no hwloc, no
# OpenBLAS (the host backend's blocked C GEMM). The OpenCL module too
# (backends/opencl/*.c, its kernels embedded by gen-kernels.sh), against
# the Khronos headers, the ICD loader and CLBlast; NVIDIA's OpenCL
# (libnvidia-opencl.so.1, from the driver's folder) is registered for it
# through OCL_ICD_VENDORS with an .icd file of the build's, as containers
# often lack /etc/OpenCL/vendors/nvidia.icd. The headers of zlib, jansson,
# OpenCL and CLBlast, the libraries the machine lacks, and Fashion-MNIST
# come from the folder tests/gpu/prepare.sh fills (_gpu/, carried beside
# the tree). The test and benchmark programs take their sources from the
# Makefile.mk lists, the nvcc flags are those of backends/cuda/Makefile.mk.
#
# Beside PyTorch (tests/gpu/side_by_side.py, python3 with torch): the
# fortunes' validation loss on cuda:0, on the host and with PyTorch's twin
# (fortunes), the fused attention alone (attention), and GPT-2 124M in f32,
# TF32 and bf16, ResNet-20 and the cnn against PyTorch's eager step and
# torch.compile (side-by-side), written to OUTDIR/side-by-side.json.
#
# The same GPU through OpenCL (the OpenCL twin of cuda:0, hidden unless
# named): the op tests, test-models and test-dp on it, our GEMM and
# CLBlast's against cuBLAS at n = 4096, the GPT and cnn steps through
# OpenCL beside cuda:0's, and a job over cuda:0, the GPU through OpenCL and
# the host (tests/test-train-vendors.sh: step for step as the host alone)
# with a trace and its breakdown (OUTDIR/mixed-trace.json).
#
# Without a GPU (a rehearsal) it builds everything, runs test-cuda (which
# must then say why CUDA is unavailable), test-abi, test-models and
# test-event-time on the host (the carried jansson) and a short training on the host (the carried data
# and zlib), and reports every GPU step as "skipped: no GPU".
#
# OUTDIR receives summary.txt (read it first), probe.log, build.log,
# tests.log, bench.log, train.log, side-by-side.json (on a GPU with
# PyTorch) and, where compute-sanitizer exists, sanitizer.log. Every step
# runs under a time limit, cut to what is left of the budget, and is
# printed as it ends. The exit status is 0 when every step passed, was
# skipped, or was partial: the optional memcheck cut short by the budget
# with no error found, or a comparison beside PyTorch whose budget left a
# case or an anchor out. The summary starts with the GPU, its
# driver and the CUDA versions.
#
# Environment:
#   CHECK_BUDGET  seconds for the whole run (default 480; the build may
#                 take three fifths of it, the comparisons beside PyTorch
#                 what the steps before them left)
#   CHECK_BUILD   build folder (default /tmp/chorus-gpu-check, emptied)
#   CHECK_CARRY   the prepared folder (default _gpu at the top of the tree)
#   CUDA_ARCH     compute capabilities to compile for, e.g. "90" or "90
#                 100" (default: the GPU's; without one, configure's
#                 default list)
#   CHECK_OPENCL_ICD  a rehearsal of the OpenCL part without a GPU: an .icd
#                 file (/etc/OpenCL/vendors/pocl.icd) whose OpenCL stands in
#                 for NVIDIA's, its first device for the GPU
#   CHECK_PARTS   the parts to run after the build, of: tests train opencl
#                 fortunes benches side-by-side sanitizer (default: all;
#                 one run of all of them takes more than ten minutes on a
#                 GPU, so a short lease runs them in two calls)
set -u

SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUTDIR=""
B=${CHECK_BUILD:-/tmp/chorus-gpu-check}
CARRY=${CHECK_CARRY:-$SRC/_gpu}
BUDGET=${CHECK_BUDGET:-480}
# The environment PyTorch's runs get: LD_LIBRARY_PATH as it came, before
# the check puts the toolkit's and the carried libraries first (which could
# shadow the CUDA libraries of PyTorch's own wheels).
ORIG_LD_SET=${LD_LIBRARY_PATH+1}
ORIG_LD=${LD_LIBRARY_PATH-}
RESERVE=10
START=$(date +%s)
FAILED=0
ROWS=()
NOTES=()

elapsed() { echo $(($(date +%s) - START)); }
log() { printf '%s\n' "$*"; }

# Seconds a step may take: its own limit, or what is left of the budget.
limit() {
    local left=$((BUDGET - $(elapsed) - RESERVE))
    [ "$left" -lt 1 ] && left=1
    [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}

out_of_time() { [ $((BUDGET - $(elapsed) - RESERVE)) -lt 3 ]; }

row() { # step result seconds detail
    ROWS+=("$(printf '%-18s %-8s %5s  %s' "$1" "$2" "$3" "$4")")
    printf '[%4ss] %-18s %-8s %s\n' "$(elapsed)" "$1" "$2" "$4"
    case $2 in ok | skipped | partial) ;; *) FAILED=1 ;; esac
}

note() { NOTES+=("$*"); }

# ---- probe ------------------------------------------------------------------

NVCC="" CUDA_HOME="" GPU="" GPU_ARCH="" NVDIRS=() TORCH=""
GPU_NAME="" DRIVER="" DRIVER_CUDA="" TOOLKIT=""
CUBLAS_SO="" CUBLASLT_SO="" NCCL_SO="" CUDART="" CUBLAS_INC="" NCCL_INC="" SANITIZER=""
LIBDIRS=()
NV_OPENCL="" NV_OPENCL_WHY=

first() { # the first of the arguments that exists
    local f
    for f in "$@"; do [ -e "$f" ] && { echo "$f"; return 0; }; done
    return 1
}

# Where libraries and headers may be: the toolkit, then pip's nvidia-*
# packages (site-packages/nvidia/<package>/{lib,include}), then the system.
# A few globs, never a walk of the file system.
lib_dirs() {
    local d
    printf '%s\n' "$CUDA_HOME/lib64" "$CUDA_HOME"/targets/*/lib
    for d in ${NVDIRS[@]+"${NVDIRS[@]}"}; do printf '%s\n' "$d"/*/lib; done
    printf '%s\n' /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/lib
}

inc_dirs() {
    local d
    printf '%s\n' "$CUDA_HOME/include" "$CUDA_HOME"/targets/*/include
    for d in ${NVDIRS[@]+"${NVDIRS[@]}"}; do printf '%s\n' "$d"/*/include; done
    printf '%s\n' /usr/include /usr/local/include
}

find_lib() { # glob: the first match in lib_dirs
    local d f
    while read -r d; do
        for f in "$d"/$1; do [ -e "$f" ] && { echo "$f"; return 0; }; done
    done < <(lib_dirs)
    return 1
}

find_inc() { # header: the folder holding it
    local d
    while read -r d; do [ -f "$d/$1" ] && { echo "$d"; return 0; }; done < <(inc_dirs)
    return 1
}

probe_gpu() {
    log "== nvidia-smi"
    if ! command -v nvidia-smi >/dev/null; then
        log "nvidia-smi: not found"
        return
    fi
    local smi q
    smi=$(timeout 20 nvidia-smi 2>&1)
    printf '%s\n' "$smi"
    # The highest CUDA version the driver supports: only the table's header
    # says it (--query-gpu has no field for it).
    DRIVER_CUDA=$(printf '%s\n' "$smi" | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)
    q=$(timeout 20 nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version,pci.bus_id \
        --format=csv,noheader 2>/dev/null | head -n 1)
    log "query: ${q:-none}"
    [ -n "$q" ] || return
    GPU=$q
    GPU_NAME=$(printf '%s' "$q" | cut -d, -f1)
    GPU_ARCH=$(printf '%s' "$q" | cut -d, -f2 | tr -d ' .')
    DRIVER=$(printf '%s' "$q" | cut -d, -f4 | tr -d ' ')
}

# NVIDIA's OpenCL library, which the driver installs beside libcuda.so.1:
# the loader's cache first, then the folder of libcuda.so.1, then the
# usual driver folders. NV_OPENCL_WHY says where it was not.
probe_opencl() {
    local cuda_dir="" f
    NV_OPENCL=$(ldconfig -p 2>/dev/null | awk '$1 == "libnvidia-opencl.so.1" && /x86-64/ { print $NF; exit }')
    f=$(ldconfig -p 2>/dev/null | awk '$1 == "libcuda.so.1" && /x86-64/ { print $NF; exit }')
    [ -n "$f" ] && cuda_dir=$(dirname "$(readlink -f "$f")")
    [ -n "$NV_OPENCL" ] && [ -e "$NV_OPENCL" ] ||
        NV_OPENCL=$(first ${cuda_dir:+"$cuda_dir"/libnvidia-opencl.so.1} \
            /usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1 /usr/lib64/libnvidia-opencl.so.1 \
            /usr/local/nvidia/lib64/libnvidia-opencl.so.1 /usr/lib/wsl/lib/libnvidia-opencl.so.1)
    [ -n "$NV_OPENCL" ] || NV_OPENCL_WHY="the driver has no OpenCL: no libnvidia-opencl.so.1 in ldconfig's cache${cuda_dir:+, $cuda_dir} or the usual driver folders"
    log "== NVIDIA OpenCL: ${NV_OPENCL:-none ($NV_OPENCL_WHY)}"
    log "== /etc/OpenCL/vendors: $(ls /etc/OpenCL/vendors 2>/dev/null | paste -sd' ' || true)"
}

probe_python() {
    log "== python: $(python3 --version 2>&1)"
    # nvidia is a namespace package: one folder per site-packages holding it.
    mapfile -t NVDIRS < <(timeout 20 python3 -c \
        'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null)
    log "site-packages/nvidia: ${NVDIRS[*]:-none}"
    timeout 20 python3 -c 'import importlib.metadata as m
for d in sorted(m.distributions(), key=lambda d: d.metadata["Name"].lower()):
    n = d.metadata["Name"]
    if n.lower().startswith(("nvidia-", "torch")):
        print("  ", n, d.version)' 2>/dev/null
    # PyTorch for the comparisons: its version, its CUDA, whether it sees a GPU.
    TORCH=$(timeout 120 python3 -c 'import torch
print(torch.__version__, "(CUDA %s)" % torch.version.cuda,
      "sees a GPU" if torch.cuda.is_available() else "sees no GPU")' 2>/dev/null | tail -n 1)
    log "== PyTorch: ${TORCH:-python3 cannot import torch}"
}

probe() {
    log "== $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -n), $(uname -srm), $(nproc) CPUs"
    log "== source: $SRC ($(git -C "$SRC" log -1 --format='%h %s' 2>/dev/null || echo 'not a git tree'))"
    probe_gpu
    NVCC=$(command -v nvcc || first /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc)
    log "== nvcc: ${NVCC:-not found}"
    if [ -n "$NVCC" ]; then
        NVCC=$(readlink -f "$NVCC")
        "$NVCC" --version | tail -n 2
        # "Cuda compilation tools, release 13.0, V13.0.48" -> "13.0 (V13.0.48)"
        TOOLKIT=$("$NVCC" --version | sed -n 's/.*release \([0-9.]*\), V\([0-9.]*\).*/\1 (V\2)/p')
        CUDA_HOME=$(cd "$(dirname "$NVCC")/.." && pwd)
    fi
    log "== gcc: $(gcc --version 2>&1 | head -n 1)"
    probe_opencl
    probe_python
    CUBLAS_SO=$(find_lib 'libcublas.so.[0-9]*')
    CUBLASLT_SO=$(find_lib 'libcublasLt.so.[0-9]*')
    CUBLAS_INC=$(find_inc cublas_v2.h)
    NCCL_SO=$(find_lib 'libnccl.so.[0-9]*')
    NCCL_INC=$(find_inc nccl.h)
    # Static cudart needs only the driver at run time; the wheels ship only
    # the shared one.
    CUDART=$(first "$CUDA_HOME/lib64/libcudart_static.a" "$CUDA_HOME"/targets/*/lib/libcudart_static.a ||
        find_lib 'libcudart.so.[0-9]*')
    SANITIZER=$(command -v compute-sanitizer ||
        first "$CUDA_HOME/bin/compute-sanitizer" "$CUDA_HOME/compute-sanitizer/compute-sanitizer")
    local f
    for f in "$CUBLAS_SO" "$NCCL_SO" "$CUDART"; do
        [ -n "$f" ] && LIBDIRS+=("$(dirname "$f")")
    done
    if [ -z "${CUDA_ARCH:-}" ]; then
        CUDA_ARCH=${GPU_ARCH:-$(sed -n 's/.*with_cuda_arch="\([0-9 ]*\)".*/\1/p' \
            "$SRC/configure.ac" | head -n 1)}
    fi
    log "== searched (in this order): $(lib_dirs | while read -r d; do [ -d "$d" ] && echo "$d"; done | paste -sd' ')"
    log "== chosen"
    log "nvcc      ${NVCC:-none} (arch: $CUDA_ARCH)"
    log "cuBLAS    ${CUBLAS_SO:-none}, cublas_v2.h in ${CUBLAS_INC:-none}"
    log "cuBLASLt  ${CUBLASLT_SO:-none}"
    log "NCCL      ${NCCL_SO:-none}, nccl.h in ${NCCL_INC:-none}"
    log "cudart    ${CUDART:-none}"
    log "sanitizer ${SANITIZER:-none}"
}

# ---- the carried folder -----------------------------------------------------

ZINC="" JINC="" ZLIB="" JLIB="" DATA="" FORTUNES="" CARRY_USED=""
CLINC="" CLLIB="" CLBLAST_INC="" CLBLAST_LIB=""

# A library the system has (by soname), else the carried copy. The
# system's only when the file ldconfig's cache names is there, a non-empty
# regular file: a cache can outlive the library it lists.
pick_lib() { # soname
    local f
    f=$(ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n && /x86-64/ { print $NF; exit }')
    if [ -n "$f" ] && [ -f "$(readlink -f "$f")" ] && [ -s "$(readlink -f "$f")" ]; then
        echo "$f"
    elif [ -f "$CARRY/lib/$1" ]; then
        echo "$CARRY/lib/$1"
    fi
}

carried() {
    local used=()
    if [ -f "$CARRY/MANIFEST" ]; then
        log "== $CARRY/MANIFEST"
        sed -n '1,2p' "$CARRY/MANIFEST"
        if (cd "$CARRY" && awk '!/^#/ { print $1 "  " $3 }' MANIFEST | sha256sum -c --quiet); then
            log "every file matches its checksum"
        else
            note "the carried folder $CARRY does not match its MANIFEST (probe.log)"
            FAILED=1
        fi
    else
        log "== no carried folder at $CARRY"
    fi
    # Headers: the carried ones (made for this), else the system's.
    ZINC=$(first "$CARRY/include/zlib.h" /usr/include/zlib.h)
    JINC=$(first "$CARRY/include/jansson.h" /usr/include/jansson.h)
    ZLIB=$(pick_lib libz.so.1)
    JLIB=$(pick_lib libjansson.so.4)
    # OpenCL: the Khronos headers, the ICD loader and CLBlast.
    CLINC=$(first "$CARRY/include/CL/cl.h" /usr/include/CL/cl.h)
    CLBLAST_INC=$(first "$CARRY/include/clblast_c.h" /usr/include/clblast_c.h)
    CLLIB=$(pick_lib libOpenCL.so.1)
    CLBLAST_LIB=$(pick_lib libclblast.so.1)
    DATA=$(first "$CARRY/data/fashion-mnist/train-images-idx3-ubyte.gz" \
        /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz)
    # The fortunes' texts: the carried folder (its plain files), else Debian's.
    FORTUNES=$(first "$CARRY/data/fortunes/fortunes" /usr/share/games/fortunes/fortunes)
    ZINC=${ZINC%/*} JINC=${JINC%/*} DATA=${DATA%/*} FORTUNES=${FORTUNES%/*}
    CLINC=${CLINC%/CL/cl.h} CLBLAST_INC=${CLBLAST_INC%/*}
    [ "$ZINC" = "$CARRY/include" ] && used+=("zlib.h")
    [ "$JINC" = "$CARRY/include" ] && used+=("jansson.h")
    case $ZLIB in "$CARRY"/*) used+=("libz.so.1") ;; esac
    case $JLIB in "$CARRY"/*) used+=("libjansson.so.4") ;; esac
    [ "$CLINC" = "$CARRY/include" ] && used+=("CL/*.h")
    case $CLLIB in "$CARRY"/*) used+=("libOpenCL.so.1") ;; esac
    case $CLBLAST_LIB in "$CARRY"/*) used+=("libclblast.so.1") ;; esac
    [ "$DATA" = "$CARRY/data/fashion-mnist" ] && used+=("Fashion-MNIST")
    [ "$FORTUNES" = "$CARRY/data/fortunes" ] && used+=("fortunes")
    log "zlib.h in ${ZINC:-none}, libz ${ZLIB:-none}"
    log "jansson.h in ${JINC:-none}, libjansson ${JLIB:-none}"
    log "OpenCL headers in ${CLINC:-none}, loader ${CLLIB:-none}"
    log "CLBlast: clblast_c.h in ${CLBLAST_INC:-none}, ${CLBLAST_LIB:-none}"
    log "Fashion-MNIST in ${DATA:-none}"
    log "fortunes in ${FORTUNES:-none}"
    if [ ${#used[@]} -gt 0 ]; then
        CARRY_USED="$CARRY, used: $(printf '%s\n' "${used[@]}" | paste -sd, | sed 's/,/, /g')"
    else
        CARRY_USED="${CARRY}: not used (absent, or the system had everything)"
    fi
    log "$CARRY_USED"
}

# ---- build ------------------------------------------------------------------

CFLAGS=(-std=gnu11 -O2 -g -Wall -Wextra -ffp-contract=off -fPIC -fopenmp -pthread
    -DHAVE_CONFIG_H -DCHI_TEST_HOOKS)
BUILT=()
NO_ZLIB=0 NO_JANSSON=0
# The carried libraries the system lacks, alone in a folder of their own
# (the carried folder's lib/ also holds those the system has, which must
# not shadow the system's): libchorus.so's RUNPATH, and what the linker
# searches for libchorus.so's own dependencies when it links a program or
# the module against it (-rpath-link). Without that, a machine with no
# libjansson.so.4 of its own fails every link that names -lchorus
# ("libjansson.so.4, needed by libchorus.so, not found").
CARRIED_LIBS="$B/carried"
LINK_RP=()

# Copies the carried libraries in use into CARRIED_LIBS.
carry_libs() {
    local l
    for l in "$ZLIB" "$JLIB" "$CLLIB" "$CLBLAST_LIB"; do
        case $l in "$CARRY"/*) mkdir -p "$CARRIED_LIBS" && cp "$l" "$CARRIED_LIBS/" || return 1 ;; esac
    done
    [ -d "$CARRIED_LIBS" ] && LINK_RP=("-Wl,-rpath-link,$CARRIED_LIBS")
    return 0
}

cc() { # gcc with the project's flags and include folders
    gcc "${CFLAGS[@]}" -I"$B" -I"$SRC/include" -I"$SRC/lib" -I"$SRC/backends/host" \
        ${ZINC:+-I"$ZINC"} ${JINC:+-I"$JINC"} "$@"
}

# The .c files an Automake variable lists (=, += and continued lines).
am_sources() {
    cat "$SRC"/Makefile.am "$SRC"/*/Makefile.mk "$SRC"/*/*.mk 2>/dev/null |
        sed -e ':a' -e '/\\$/N; s/\\\n/ /; ta' |
        awk -v v="$1" '$1 == v && ($2 == "=" || $2 == "+=") {
            for (i = 3; i <= NF; i++) if ($i ~ /\.c$/) print $i }' | sort -u
}

# Run jobs in the background, at most $(nproc) at once; wait_all: 0 when
# every one succeeded.
PIDS=()
spawn() {
    while [ "$(jobs -pr | wc -l)" -ge "$(nproc)" ]; do wait -n; done
    "$@" &
    PIDS+=($!)
}
wait_all() {
    local p rc=0
    for p in "${PIDS[@]}"; do wait "$p" || rc=1; done
    PIDS=()
    return $rc
}

# Sources of the library, less those whose headers are missing. Built
# without MPI: the transport across processes is nn/dist_mpi.c's, which
# Automake leaves out for nn/dist_local.c when configure finds no MPI.
lib_sources() {
    local f
    for f in "$SRC"/lib/*.c "$SRC"/backends/host/*.c "$SRC"/nn/*.c; do
        if grep -q '#include <mpi.h>' "$f"; then continue; fi
        if [ "$NO_ZLIB" = 1 ] && grep -q '#include <zlib.h>' "$f"; then continue; fi
        if [ "$NO_JANSSON" = 1 ] && grep -q '#include <jansson.h>' "$f"; then continue; fi
        echo "$f"
    done
}

build_lib() {
    mkdir -p "$B/obj" "$B/mod" "$B/cuda" || return 1
    local version
    version=$(sed -n 's/^AC_INIT(\[[^]]*\], *\[\([^]]*\)\].*/\1/p' "$SRC/configure.ac")
    {
        printf '#define PACKAGE_VERSION "%s"\n#define VERSION "%s"\n' "$version" "$version"
        [ -n "$NVCC" ] && printf '#define CH_BUILT_CUDA 1\n'
    } >"$B/config.h"
    [ -n "$ZINC" ] && [ -n "$ZLIB" ] || { NO_ZLIB=1; log "no zlib: data sets left out"; }
    [ -n "$JINC" ] && [ -n "$JLIB" ] || { NO_JANSSON=1; log "no jansson: checkpoints left out"; }
    local f o objs=()
    while read -r f; do
        o="$B/obj/$(basename "$(dirname "$f")")-$(basename "$f" .c).o"
        objs+=("$o")
        log "gcc -c $f"
        spawn cc "-DCH_BACKEND_DIR=\"$B/mod\"" -c -o "$o" "$f"
    done < <(lib_sources)
    wait_all || return 1
    log "gcc -shared -o $B/libchorus.so.2 (${#objs[@]} objects)"
    local rpath=()
    [ -d "$CARRIED_LIBS" ] && rpath=("-Wl,-rpath,$CARRIED_LIBS")
    gcc -shared -fopenmp -pthread -Wl,-soname,libchorus.so.2 -o "$B/libchorus.so.2" "${objs[@]}" \
        ${ZLIB:+"$ZLIB"} ${JLIB:+"$JLIB"} ${rpath[@]+"${rpath[@]}"} -lm -ldl || return 1
    ln -sf libchorus.so.2 "$B/libchorus.so"
}

gencode() {
    local a last=""
    for a in $CUDA_ARCH; do
        printf -- '-gencode=arch=compute_%s,code=sm_%s\n' "$a" "$a"
        last=$a
    done
    [ -n "$last" ] && printf -- '-gencode=arch=compute_%s,code=compute_%s\n' "$last" "$last"
    [ "$(echo "$CUDA_ARCH" | wc -w)" -gt 1 ] && printf -- '--threads=0\n'
}

build_module() {
    local nccl_def=() nccl_lib=() incs=(-I"$CUDA_HOME/include") f o
    [ -n "$CUBLAS_INC" ] && incs+=(-I"$CUBLAS_INC")
    if [ -n "$NCCL_SO" ] && [ -n "$NCCL_INC" ]; then
        nccl_def=(-DCH_HAVE_NCCL=1)
        nccl_lib=("$NCCL_SO")
        incs+=(-I"$NCCL_INC")
    fi
    local gen
    mapfile -t gen < <(gencode)
    for f in "$SRC"/backends/cuda/*.cu; do
        o="$B/cuda/$(basename "$f" .cu).o"
        log "nvcc ${gen[*]} -c $f"
        spawn "$NVCC" "${gen[@]}" -std=c++20 -O3 --fmad=false -Xcompiler=-fPIC \
            -Xcompiler=-Wall,-Wextra -DCHI_TEST_HOOKS -I"$B" -I"$SRC/include" -I"$SRC/lib" "${incs[@]}" \
            ${nccl_def[@]+"${nccl_def[@]}"} -c -o "$o" "$f"
    done
    wait_all || return 1
    local rp=() d
    for d in "${LIBDIRS[@]}"; do rp+=("-Wl,-rpath,$d" "-Wl,-rpath-link,$d"); done
    log "g++ -shared -o $B/mod/chorus-cuda.so (NCCL: ${nccl_lib[*]:-no})"
    g++ -shared -o "$B/mod/chorus-cuda.so" "$B"/cuda/*.o -L"$B" -lchorus ${LINK_RP[@]+"${LINK_RP[@]}"} \
        ${CUBLASLT_SO:+"$CUBLASLT_SO"} "$CUBLAS_SO" ${nccl_lib[@]+"${nccl_lib[@]}"} "$CUDART" \
        ${rp[@]+"${rp[@]}"} -ldl -lrt -lpthread -lstdc++ || return 1
    nm -D --defined-only "$B/mod/chorus-cuda.so" | grep -q ' chorus_backend_entry$' ||
        { log "chorus-cuda.so does not export chorus_backend_entry"; return 1; }
}

# The OpenCL module: backends/opencl/*.c and the kernels gen-kernels.sh
# embeds (every .cl, lib/philox.h and lib/kernels/*.h), linked against the
# ICD loader and CLBlast (CLBlast left out where it is missing).
build_opencl_module() {
    local d="$B/opencl" f o objs=() clb_def=() clb_inc=() clb_lib=()
    mkdir -p "$d" || return 1
    if [ -n "$CLBLAST_INC" ] && [ -n "$CLBLAST_LIB" ]; then
        clb_def=(-DHAVE_CLBLAST=1)
        clb_inc=(-I"$CLBLAST_INC")
        clb_lib=("$CLBLAST_LIB")
    fi
    local embedded=() rel
    for f in "$SRC"/backends/opencl/*.cl "$SRC"/lib/philox.h "$SRC"/lib/kernels/*.h; do
        rel=${f#"$SRC"/}
        embedded+=("$rel")
    done
    log "gen-kernels.sh -> $d/kernels.c (${#embedded[@]} files)"
    sh "$SRC/backends/opencl/gen-kernels.sh" "$SRC" include/chorus/ops.h lib/backend.h -- \
        "${embedded[@]}" >"$d/kernels.c" || return 1
    for f in "$SRC"/backends/opencl/*.c "$d/kernels.c"; do
        o="$d/$(basename "$f" .c).o"
        objs+=("$o")
        log "gcc -c $f"
        spawn cc -I"$SRC/backends/opencl" -I"$CLINC" ${clb_inc[@]+"${clb_inc[@]}"} \
            ${clb_def[@]+"${clb_def[@]}"} -c -o "$o" "$f"
    done
    wait_all || return 1
    local rpath=()
    [ -d "$CARRIED_LIBS" ] && rpath=("-Wl,-rpath,$CARRIED_LIBS")
    log "gcc -shared -o $B/mod/chorus-opencl.so (CLBlast: ${clb_lib[*]:-no})"
    gcc -shared -pthread -o "$B/mod/chorus-opencl.so" "${objs[@]}" -L"$B" -lchorus \
        ${LINK_RP[@]+"${LINK_RP[@]}"} "$CLLIB" ${clb_lib[@]+"${clb_lib[@]}"} \
        ${rpath[@]+"${rpath[@]}"} -lm || return 1
    nm -D --defined-only "$B/mod/chorus-opencl.so" | grep -q ' chorus_backend_entry$' ||
        { log "chorus-opencl.so does not export chorus_backend_entry"; return 1; }
}

program() { # name folder [extra gcc arguments]: sources from the Makefile.mk lists
    local name=$1 dir=$2
    shift 2
    local var srcs=() f
    var=$(printf '%s_%s_SOURCES' "$dir" "$name" | tr -- '-/.' '___')
    while read -r f; do srcs+=("$SRC/$f"); done < <(am_sources "$var")
    [ ${#srcs[@]} -gt 0 ] || srcs=("$SRC/$dir/$name.c")
    [ "$dir" = tests ] && while read -r f; do srcs+=("$SRC/$f"); done \
        < <(am_sources tests_libtestutil_la_SOURCES)
    log "gcc -o $B/$name ${srcs[*]#"$SRC"/}"
    cc -I"$SRC/tests" -o "$B/$name" "${srcs[@]}" "$@" -L"$B" -lchorus ${LINK_RP[@]+"${LINK_RP[@]}"} \
        ${ZLIB:+"$ZLIB"} -lm -lpthread && touch "$B/$name.built"
}

# test-abi's three modules that the registry must refuse.
abi_modules() {
    mkdir -p "$B/wrong-abi" "$B/missing-slot" "$B/partial-conv" &&
        cc -shared -o "$B/wrong-abi/chorus-cuda.so" "$SRC/tests/wrong-abi-module.c" &&
        cc -shared -o "$B/missing-slot/chorus-opencl.so" "$SRC/tests/missing-slot-module.c" &&
        cc -shared -DPARTIAL_CONV -o "$B/partial-conv/chorus-opencl.so" \
            "$SRC/tests/missing-slot-module.c"
}

build_programs() {
    local t defs
    spawn abi_modules
    # The CUDA attention's tiles on the CPU (plain C: without a GPU too).
    spawn program test-cuda-flash tests -I"$SRC/backends/cuda"
    for t in test-cuda test-abi test-ops test-ops-grad test-ops-attn test-ops-norm test-errors test-reduce \
        test-dp test-cast test-half test-memory test-math-mode test-gpu-steps; do
        defs=()
        if [ "$t" = test-cuda ] && [ -f "$B/mod/chorus-cuda.so" ]; then
            defs=(-DCH_TEST_HAVE_CUDA=1)
            [ -n "$NCCL_SO" ] && [ -n "$NCCL_INC" ] && defs+=(-DCH_TEST_HAVE_NCCL=1)
        fi
        spawn program "$t" tests ${defs[@]+"${defs[@]}"}
    done
    # The ResNet and GPT fixtures (PyTorch's numbers) on every device: the
    # test reads them with jansson itself.
    # Device time in the trace, on every device (its trace files read back
    # with jansson too).
    if [ "$NO_JANSSON" = 0 ]; then
        spawn program test-models tests "$JLIB"
        spawn program test-event-time tests "$JLIB"
        spawn program test-timeline tests "$JLIB"
    else
        echo "no jansson" >"$B/test-models.why"
        echo "no jansson" >"$B/test-event-time.why"
        echo "no jansson" >"$B/test-timeline.why"
    fi
    spawn program chorus-info utils
    if [ "$NO_ZLIB$NO_JANSSON" = 00 ]; then
        spawn program chorus-train utils
    else
        echo "no zlib or jansson" >"$B/chorus-train.why"
    fi
    for t in bench-ops bench-train bench-dp bench-allreduce; do spawn program "$t" bench; done
    local rp=() d
    for d in "${LIBDIRS[@]}"; do rp+=("-Wl,-rpath-link,$d"); done
    [ -n "$CUBLAS_SO" ] && spawn program bench-cublas bench -I"$CUDA_HOME/include" \
        ${CUBLAS_INC:+-I"$CUBLAS_INC"} "$CUBLAS_SO" "$CUDART" ${rp[@]+"${rp[@]}"} -ldl -lrt -lstdc++
    wait_all
    for t in "$B"/*.built; do [ -e "$t" ] && BUILT+=("$(basename "$t" .built)"); done
}

build() {
    rm -rf "$B" && mkdir -p "$B" || return 1
    carry_libs || { log "BUILD FAILED: cannot copy the carried libraries into $CARRIED_LIBS"; return 1; }
    build_lib || { log "BUILD FAILED: libchorus"; return 1; }
    local rc=0
    if [ -n "$NVCC" ] && [ -n "$CUBLAS_SO" ] && [ -n "$CUDART" ]; then
        build_module || { log "BUILD FAILED: chorus-cuda.so"; rc=1; }
    else
        log "no nvcc, cuBLAS or cudart: the CUDA module is not built"
        rc=1
    fi
    if [ -n "$CLINC" ] && [ -n "$CLLIB" ]; then
        build_opencl_module || { log "BUILD FAILED: chorus-opencl.so"; rc=1; }
    else
        log "no OpenCL headers or ICD loader (run tests/gpu/prepare.sh): the OpenCL module is not built"
        rc=1
    fi
    build_programs || { log "BUILD FAILED: some programs"; rc=1; }
    log "built: ${BUILT[*]:-nothing}"
    return $rc
}

built() { [ -e "$B/$1.built" ]; }

# ---- steps ------------------------------------------------------------------

NCUDA=0 CUDA_WHY=""

# What the library itself sees: the CUDA devices chorus-info lists, or why
# the backend is unavailable.
cuda_devices() {
    built chorus-info || { CUDA_WHY="chorus-info was not built"; return; }
    NCUDA=$(timeout 30 "$B/chorus-info" --json 2>/dev/null | grep -c '"id": "cuda:')
    CUDA_WHY=$(timeout 30 "$B/chorus-info" 2>&1 | tee -a "$OUTDIR/tests.log" |
        awk '$1 == "cuda" && $2 != "loaded" { $1 = $2 = ""; sub(/^ +/, ""); print; exit }')
}

tap_counts() { # log: "N ok, N not ok, N skipped" and whether the plan came
    local ok notok skip plan
    ok=$(grep -c '^ok ' "$1")
    skip=$(grep -ci '^ok .*# skip' "$1")
    notok=$(grep -c '^not ok ' "$1")
    plan=$(grep -m 1 -E '^1\.\.[0-9]+' "$1" || echo "no plan: it stopped early")
    echo "$((ok - skip)) ok, $notok not ok, $skip skipped ($plan)"
}

DETAIL_FN=""

# run STEP KIND LOG LIMIT [VAR=value ...] PROGRAM [ARGS]: one program under
# a time limit, its output appended to LOG. KIND tap: the TAP counts
# decide; plain: the exit status. DETAIL_FN, when set, writes the detail
# of a step that passed.
run() {
    local step=$1 kind=$2 logf=$3 lim=$4
    shift 4
    local envs=()
    while [[ $1 == *=* ]]; do envs+=("$1"); shift; done
    local prog=$1 exe
    shift
    # A path (a script of the tree) runs as it is; a name is a built program.
    case $prog in */*) exe=$prog ;; *) exe=$B/$prog ;; esac
    if [ "$exe" = "$B/$prog" ] && ! built "$prog"; then
        # Left out on purpose (a library missing, said in build.log), or
        # its build failed, which the build row has already counted.
        if [ -s "$B/$prog.why" ]; then
            row "$step" skipped 0 "not built: $(cat "$B/$prog.why")"
        else
            row "$step" FAILED 0 "not built (build.log)"
        fi
        return 1
    fi
    if out_of_time; then
        row "$step" skipped 0 "no time left in the budget"
        return 1
    fi
    lim=$(limit "$lim")
    local own="$B/$step.out" t0 rc secs
    t0=$(date +%s)
    env ${envs[@]+"${envs[@]}"} timeout -k 5 "$lim" "$exe" "$@" >"$own" 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
    { echo "== $step: ${envs[*]+"${envs[*]}"} ${prog##*/} $* (limit ${lim}s, exit $rc, ${secs}s)"; cat "$own"; echo; } >>"$logf"
    local detail result=ok
    if [ "$kind" = tap ]; then
        detail=$(tap_counts "$own")
        # An expected failure ("not ok ... # TODO") fails nothing.
        grep '^not ok' "$own" | grep -v '# TODO' | head -n 8 | sed "s|^|$step: |" >>"$B/failures"
        grep '^not ok' "$own" | grep -qv '# TODO' || ! grep -q '^1\.\.' "$own" && result=FAILED
    else
        detail="exit $rc"
    fi
    [ $rc -eq 0 ] || result=FAILED
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && { result=TIMEOUT; detail="after ${lim}s; $detail"; }
    if [ "$result" = ok ] && [ -n "$DETAIL_FN" ]; then
        detail=$("$DETAIL_FN" "$step")
    elif [ "$result" != ok ] && [ "$kind" = plain ]; then
        tail -n 3 "$own" | sed "s|^|$step: |" >>"$B/failures"
    fi
    row "$step" "$result" "$secs" "$detail"
    [ "$result" = ok ]
}

# A GPU step: skipped without a GPU the library can use.
gpu() {
    if [ "$NCUDA" -lt 1 ]; then
        row "$1" skipped 0 "no GPU"
        return 1
    fi
    run "$@"
}

bench_block() { # step title: its output into the summary's benchmark part
    [ -s "$B/$1.out" ] || return
    printf '\n== %s\n' "$2" >>"$B/benchmarks"
    grep -v '^$' "$B/$1.out" | head -n 40 >>"$B/benchmarks"
}

train_detail() { # step: accuracy and speed from chorus-train --json
    local j
    j=$(grep -m 1 '^{.*test_accuracy' "$B/$1.out") || { echo "exit 0, no JSON result"; return; }
    printf '%s\n' "$j" | sed -e 's/.*"test_accuracy": *\([0-9.]*\).*"samples_per_s": *\([0-9.]*\).*"steps": *\([0-9]*\).*/test accuracy \1, \2 samples\/s, \3 steps/'
}

run_tests() {
    local t
    # Without a GPU too: the module must load and say why it found none.
    run test-cuda tap "$OUTDIR/tests.log" 120 test-cuda
    # The CUDA module's answers to enum values beyond its own (GPU), and
    # the refused modules (everywhere).
    run test-abi tap "$OUTDIR/tests.log" 60 CHORUS_TEST_WRONG_ABI_DIR="$B/wrong-abi" \
        CHORUS_TEST_MISSING_SLOT_DIR="$B/missing-slot" CHORUS_TEST_PARTIAL_CONV_DIR="$B/partial-conv" \
        test-abi
    gpu test-ops tap "$OUTDIR/tests.log" 120 test-ops
    for t in test-ops-grad test-ops-attn test-ops-norm test-errors test-cast test-half test-memory \
        test-math-mode; do
        gpu "$t" tap "$OUTDIR/tests.log" 90 "$t"
    done
    run test-cuda-flash tap "$OUTDIR/tests.log" 60 test-cuda-flash
    # No op of a GPT or ResNet step (f32, bf16) on cuda:0 runs on the host:
    # its cuda:0 line must be there and pass, not just a passing run.
    gpu test-gpu-steps tap "$OUTDIR/tests.log" 120 test-gpu-steps
    if [ "$NCUDA" -lt 1 ]; then
        row fallback-cuda skipped 0 "no GPU"
    elif built test-gpu-steps; then
        if grep -q '^ok .* cuda:0: no op of the steps ran on the host' "$B/test-gpu-steps.out" \
            2>/dev/null; then
            row fallback-cuda ok 0 "cuda:0: ch_fallback_count 0 after GPT and ResNet steps"
        else
            row fallback-cuda FAILED 0 "$(grep -m 1 'cuda:0: .*ran on the host' \
                "$B/test-gpu-steps.out" 2>/dev/null || echo 'no cuda:0 line') (tests.log)"
        fi
    fi
    # On every device, so without a GPU too (the carried jansson at work);
    # on a GPU its cuda:0 checks must be there, not just a passing run.
    run test-models tap "$OUTDIR/tests.log" 120 CHORUS_TEST_SRCDIR="$SRC" test-models
    if [ "$NCUDA" -lt 1 ]; then
        row test-models-cuda skipped 0 "no GPU"
    elif built test-models; then
        local n
        n=$(grep -cE '^(not )?ok .* on cuda:0: ' "$B/test-models.out" 2>/dev/null)
        if [ "${n:-0}" -gt 0 ]; then
            row test-models-cuda ok 0 "$n fixture checks on cuda:0 (counted in test-models)"
        else
            row test-models-cuda FAILED 0 "no fixture check ran on cuda:0 (tests.log)"
        fi
    fi
    # Events timed on the device and moved onto the host's clock, on every
    # device (the host without a GPU); on a GPU its cuda:0 checks must be
    # there (timed events after clock_zero), and the row gives the offset.
    run test-event-time tap "$OUTDIR/tests.log" 60 test-event-time
    if [ "$NCUDA" -lt 1 ]; then
        row event-time-cuda skipped 0 "no GPU"
    elif built test-event-time; then
        local d
        d=$(grep -m 1 '^# cuda:0 (' "$B/test-event-time.out" 2>/dev/null |
            sed -e 's/^# cuda:0 ([^)]*): //' -e 's/;.*//')
        if [ -n "$d" ]; then
            row event-time-cuda ok 0 "cuda:0: $d (counted in test-event-time)"
        else
            row event-time-cuda FAILED 0 "no timing check ran on cuda:0 (tests.log)"
        fi
    fi
    gpu test-reduce tap "$OUTDIR/tests.log" 60 CHORUS_TEST_DEVICES=cuda:0,cuda:0,cuda:0 test-reduce
    gpu test-dp tap "$OUTDIR/tests.log" 90 CHORUS_TEST_DEVICES=cuda:0,cuda:0 test-dp
    # The timeline over host and cuda:0 (and any OpenCL device): the trace
    # read back, cuda:0's work timed by CUDA events, the breakdown.
    gpu test-timeline tap "$OUTDIR/tests.log" 120 test-timeline
}

run_train() {
    local args=(--epochs 1 --json --quiet --data "$DATA")
    if [ -z "$DATA" ]; then
        row train-host skipped 0 "no Fashion-MNIST (run tests/gpu/prepare.sh and carry _gpu)"
        row train-cuda skipped 0 "no Fashion-MNIST"
        return
    fi
    DETAIL_FN=train_detail
    # The data path (carried files, zlib) on the host, quickly: 1000 images.
    run train-host plain "$OUTDIR/train.log" 60 chorus-train --devices host --model mlp \
        --limit 1000 "${args[@]}"
    gpu train-cuda plain "$OUTDIR/train.log" 150 chorus-train --devices cuda:0 --model cnn \
        "${args[@]}"
    # The sharded optimizer and a memory limit on the GPU beside the host:
    # cuda:0 held to 256 MiB keeps its part of Adam's state and trains its
    # share in micro-batches that fit (the peak and the parts in the JSON).
    gpu train-cuda-shard plain "$OUTDIR/train.log" 150 chorus-train --devices host,cuda:0 \
        --model cnn --limit 6000 --shard-optimizer --device-memory cuda:0=256M "${args[@]}"
    DETAIL_FN=""
}

run_benches() {
    gpu bench-cublas plain "$OUTDIR/bench.log" 60 bench-cublas 1024 2048 4096 &&
        bench_block bench-cublas "bench-cublas: ch_gemm against cuBLAS (f32, bf16, f16 inputs) on cuda:0"
    gpu bench-train plain "$OUTDIR/bench.log" 60 bench-train --devices cuda:0 &&
        bench_block bench-train "bench-train --devices cuda:0 (mlp and cnn, samples/s)"
    # Mixed precision: the gpt in f32 and in bf16 (target: bf16 at 2x f32),
    # at its default size (4 layers of width 128: GEMMs of 4096x128x128,
    # so the step is bound by kernel launches in either format) and at
    # GPT-2 small's shape (12 layers, 12 heads, width 768, context 256;
    # 4096 tokens a step, about 2 TFLOP), where the GEMMs decide the speed
    # as in the training people compare with.
    local shape name batch opts p
    for shape in "default 64" "gpt2s 16 --layers 12 --heads 12 --dim 768 --context 256"; do
        read -r name batch opts <<<"$shape"
        for p in f32 bf16; do
            # shellcheck disable=SC2086 # opts: the shape's options, as words
            gpu "gpt-$name-$p" plain "$OUTDIR/bench.log" 120 bench-train --devices cuda:0 \
                --model gpt --batch "$batch" --steps 20 --precision "$p" $opts &&
                bench_block "gpt-$name-$p" \
                    "bench-train --devices cuda:0 --model gpt --batch $batch $opts --precision $p"
        done
    done
    # GPT-2 small's shape in bf16 once more as the step ran before its
    # fusions (--unfused: the loss's forward and backward apart, Adam a
    # launch per tensor): launches a step and the GEMMs' share before and
    # after, on the same GPU in the same call.
    gpu gpt-gpt2s-unfused plain "$OUTDIR/bench.log" 120 bench-train --devices cuda:0 \
        --model gpt --batch 16 --steps 20 --precision bf16 --layers 12 --heads 12 --dim 768 \
        --context 256 --unfused &&
        bench_block gpt-gpt2s-unfused \
            "bench-train --devices cuda:0 --model gpt --batch 16 (GPT-2 small's shape) --precision bf16 --unfused"
    gpu bench-ops plain "$OUTDIR/bench.log" 60 bench-ops --devices cuda:0 --sizes 1024,4096 &&
        bench_block bench-ops "bench-ops --devices cuda:0"
    gpu allreduce-x2 plain "$OUTDIR/bench.log" 40 bench-allreduce --devices cuda:0,cuda:0 \
        --mode peer --max-mb 256 && bench_block allreduce-x2 "bench-allreduce, cuda:0 x2"
    gpu allreduce-x3 plain "$OUTDIR/bench.log" 40 bench-allreduce --devices cuda:0,cuda:0,cuda:0 \
        --mode peer --max-mb 256 && bench_block allreduce-x3 "bench-allreduce, cuda:0 x3"
    # bf16 against f32 through the host, where the bytes cross PCIe.
    gpu allreduce-bf16 plain "$OUTDIR/bench.log" 60 bench-allreduce --devices cuda:0,host \
        --mode host --bf16 --min-kb 4096 --max-mb 256 &&
        bench_block allreduce-bf16 "bench-allreduce --bf16, cuda:0,host through the host"
    gpu bench-dp plain "$OUTDIR/bench.log" 60 bench-dp --devices cuda:0,cuda:0 --model cnn \
        --reduce peer && bench_block bench-dp "bench-dp --devices cuda:0,cuda:0 --model cnn"
}

# ---- the same GPU through OpenCL ------------------------------------------

OCLDEV="" OCL_WHY="" OCL_DESC=""

# NVIDIA's OpenCL registered for the ICD loader through a folder of the
# build's (the only platform the steps see: OCL_ICD_VENDORS is that folder,
# empty where the driver has no OpenCL), then the library's id of the GPU
# through OpenCL: the twin chorus-info lists as "the same GPU as cuda:0",
# or an OpenCL GPU it shows (no CUDA).
opencl_setup() {
    mkdir -p "$B/icd" && export OCL_ICD_VENDORS="$B/icd"
    if [ ! -f "$B/mod/chorus-opencl.so" ]; then
        OCL_WHY="the OpenCL module was not built (build.log)"
        return
    fi
    local icd_lib=$NV_OPENCL any=""
    if [ -n "${CHECK_OPENCL_ICD:-}" ]; then
        # A rehearsal: another OpenCL (PoCL's CPU devices) stands in.
        icd_lib=$(head -n 1 "$CHECK_OPENCL_ICD" 2>/dev/null)
        any=1
    fi
    if [ -z "$icd_lib" ]; then
        OCL_WHY=$NV_OPENCL_WHY
        return
    fi
    echo "$icd_lib" >"$B/icd/opencl.icd"
    built chorus-info || { OCL_WHY="chorus-info was not built"; return; }
    local info
    info=$(timeout 60 "$B/chorus-info" 2>&1)
    printf '== chorus-info with %s registered\n%s\n' "$icd_lib" "$info" >>"$OUTDIR/tests.log"
    OCLDEV=$(printf '%s\n' "$info" | awk '/the same GPU as cuda:0/ { print $1; exit }')
    [ -n "$OCLDEV" ] || OCLDEV=$(timeout 60 "$B/chorus-info" --json 2>/dev/null | python3 -c '
import json, sys
any = len(sys.argv) > 1
print(next((d["id"] for d in json.load(sys.stdin) if d["backend"] == "opencl" and (any or d["kind"] == "gpu")), ""))' $any 2>/dev/null)
    if [ -z "$OCLDEV" ]; then
        OCL_WHY="OpenCL is registered ($icd_lib) but the library sees no OpenCL GPU: $(printf '%s\n' "$info" | awk '$1 == "opencl" { print; exit }')"
        return
    fi
    OCL_DESC="$OCLDEV ($(printf '%s\n' "$info" | awk -v d="$OCLDEV" '$1 == d { $1 = ""; sub(/^ +/, ""); print; exit }' | cut -c1-100)) through $icd_lib"
}

# An OpenCL step: skipped, saying why, without the GPU through OpenCL.
ocl() {
    if [ -z "$OCLDEV" ]; then
        row "$1" skipped 0 "no GPU through OpenCL: $OCL_WHY"
        return 1
    fi
    run "$@"
}

trace_detail() { # step: the breakdown line of chorus-train --trace
    grep -m 1 '^breakdown: ' "$B/$1.out" | cut -c1-200 || echo "exit 0, no breakdown line"
}

run_opencl() {
    local t on="CHORUS_DEVICES=host,$OCLDEV" partner=cuda:0 sizes=1024,4096 batch=64 steps=20 \
        trace_steps=30
    # A rehearsal without a GPU pairs the OpenCL device with itself, and
    # a CPU standing in takes sizes it finishes.
    [ "$NCUDA" -lt 1 ] && partner=$OCLDEV
    [ -n "${CHECK_OPENCL_ICD:-}" ] && sizes=256 batch=8 steps=3 trace_steps=2
    # The op tests, the PyTorch fixtures, data parallelism and the steps'
    # fallback count on the host and the GPU through OpenCL (named, so
    # opened beside the host).
    for t in test-ops test-ops-grad test-ops-attn test-ops-norm test-half test-cast test-errors; do
        ocl "ocl-$t" tap "$OUTDIR/tests.log" 120 "$on" "$t"
    done
    ocl ocl-test-models tap "$OUTDIR/tests.log" 120 "$on" CHORUS_TEST_SRCDIR="$SRC" test-models
    ocl ocl-test-dp tap "$OUTDIR/tests.log" 120 "$on" CHORUS_TEST_DEVICES="$OCLDEV,$OCLDEV" test-dp
    ocl ocl-gpu-steps tap "$OUTDIR/tests.log" 120 "$on" test-gpu-steps
    # GEMM at n = 4096 through OpenCL, ours and CLBlast's (cuBLAS's is
    # bench-cublas above, on the same GPU).
    ocl ocl-gemm-own plain "$OUTDIR/bench.log" 90 "$on" CHORUS_OPENCL_GEMM=own bench-ops \
        --devices "$OCLDEV" --sizes "$sizes" &&
        bench_block ocl-gemm-own "bench-ops --devices $OCLDEV, CHORUS_OPENCL_GEMM=own"
    ocl ocl-gemm-clblast plain "$OUTDIR/bench.log" 90 "$on" CHORUS_OPENCL_GEMM=clblast bench-ops \
        --devices "$OCLDEV" --sizes "$sizes" &&
        bench_block ocl-gemm-clblast "bench-ops --devices $OCLDEV, CHORUS_OPENCL_GEMM=clblast"
    # The training steps through OpenCL, beside cuda:0's (gpt-default-f32
    # and bench-train above): the same commands on the OpenCL twin.
    ocl ocl-gpt-f32 plain "$OUTDIR/bench.log" 120 "$on" bench-train --devices "$OCLDEV" \
        --model gpt --batch "$batch" --steps "$steps" --precision f32 &&
        bench_block ocl-gpt-f32 "bench-train --devices $OCLDEV --model gpt --batch $batch --precision f32"
    ocl ocl-bench-train plain "$OUTDIR/bench.log" 90 "$on" bench-train --devices "$OCLDEV" &&
        bench_block ocl-bench-train "bench-train --devices $OCLDEV (mlp and cnn, samples/s)"
    # One job over cuda:0, the GPU through OpenCL and the host: step for
    # step as the host alone (the GPT and the ResNet, test-dp's bounds),
    # and the cnn learns; then a GPT run of it traced, with its breakdown.
    if [ -z "$DATA" ]; then
        row mixed-job skipped 0 "no Fashion-MNIST (run tests/gpu/prepare.sh and carry _gpu)"
    else
        ocl mixed-job tap "$OUTDIR/train.log" 300 CHORUS_TRAIN="$B/chorus-train" \
            CHORUS_INFO="$B/chorus-info" CHORUS_TEST_DATA="$DATA" \
            CHORUS_TEST_MIXED_DEVICES="$partner,$OCLDEV" "$SRC/tests/test-train-vendors.sh"
    fi
    if [ -n "$FORTUNES" ]; then
        DETAIL_FN=trace_detail
        ocl mixed-trace plain "$OUTDIR/train.log" 120 chorus-train --devices "$partner,$OCLDEV,host" \
            --model gpt --data "$FORTUNES" --max-steps "$trace_steps" --trace "$OUTDIR/mixed-trace.json" \
            --quiet
        DETAIL_FN=""
    else
        row mixed-trace skipped 0 "no fortunes (run tests/gpu/prepare.sh and carry _gpu)"
    fi
}

# ---- beside PyTorch ------------------------------------------------------------

# The command that runs one of the built programs with the library's paths
# (written by main once they are known): tests/gpu/side_by_side.py starts
# Chorus's programs through it and PyTorch's with the environment the check
# was started with.
CHORUS_ENV=""

write_chorus_env() {
    CHORUS_ENV="$B/chorus-env"
    {
        echo '#!/usr/bin/env bash'
        echo '# Runs a program with the GPU check'"'"'s library paths (written by check.sh).'
        printf 'export LD_LIBRARY_PATH=%q\n' "$LD_LIBRARY_PATH"
        printf 'export CHORUS_BACKEND_PATH=%q\n' "$CHORUS_BACKEND_PATH"
        echo 'exec "$@"'
    } >"$CHORUS_ENV" && chmod +x "$CHORUS_ENV"
}

# pystep STEP LIMIT PROGRAM... -- ARGS: tests/gpu/side_by_side.py ARGS
# under a limit, in PyTorch's environment (LD_LIBRARY_PATH as the check
# got it), after the programs it starts were built; its output into
# bench.log, its "summary:" line the row's detail. Exit 0 ok, 3 partial
# (the budget left a part out), else FAILED.
pystep() {
    local step=$1 lim=$2 p
    shift 2
    while [ "$1" != -- ]; do
        p=$1
        shift
        built "$p" && continue
        if [ -s "$B/$p.why" ]; then
            row "$step" skipped 0 "$p not built: $(cat "$B/$p.why")"
        else
            row "$step" FAILED 0 "$p not built (build.log)"
        fi
        return 1
    done
    shift
    [ "$NCUDA" -lt 1 ] && { row "$step" skipped 0 "no GPU"; return 1; }
    out_of_time && { row "$step" skipped 0 "no time left in the budget"; return 1; }
    lim=$(limit "$lim")
    local own="$B/$step.out" t0 rc secs envs=(-u LD_LIBRARY_PATH) detail result
    [ -n "$ORIG_LD_SET" ] && envs=("LD_LIBRARY_PATH=$ORIG_LD")
    t0=$(date +%s)
    # Its own budget a little under the limit, so that it writes its JSON
    # and summary before the limit ends it.
    env "${envs[@]}" timeout -k 5 "$lim" python3 "$SRC/tests/gpu/side_by_side.py" "$@" \
        --budget $((lim > 20 ? lim - 10 : lim)) >"$own" 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
    { echo "== $step: side_by_side.py $* (limit ${lim}s, exit $rc, ${secs}s)"; cat "$own"; echo; } >>"$OUTDIR/bench.log"
    detail=$(grep '^summary: ' "$own" | tail -n 1 | sed 's/^summary: //')
    case $rc in
    0) result=ok ;;
    3) result=partial ;;
    124 | 137) result=TIMEOUT detail="after ${lim}s; ${detail:-no summary}" ;;
    *) result=FAILED detail="exit $rc; ${detail:-$(tail -n 1 "$own")}" ;;
    esac
    [ "$result" = FAILED ] && tail -n 5 "$own" | sed "s|^|$step: |" >>"$B/failures"
    row "$step" "$result" "$secs" "$detail"
    [ "$result" = ok ] || [ "$result" = partial ]
}

py_block() { # step title: side_by_side.py's final table into the summary
    [ -s "$B/$1.out" ] || return
    printf '\n== %s\n' "$2" >>"$B/benchmarks"
    sed -n '/^== table/,$p' "$B/$1.out" | sed '1d' | grep -v -e '^$' -e '^summary: ' | head -n 40 >>"$B/benchmarks"
}

# The header of side-by-side.json: the machine and the versions.
py_meta() {
    printf '%s\n' --out "$OUTDIR/side-by-side.json" --gpu-name "${GPU_NAME:-}" \
        --driver "${DRIVER:-}" --cuda-driver "${DRIVER_CUDA:-}" --cuda-toolkit "${TOOLKIT:-}" \
        --source "$(git -C "$SRC" log -1 --format='%h %s' 2>/dev/null || echo "$SRC")"
}

# The fortunes: chorus-train's GPT (4 layers, width 128, context 64, batch
# 32) for 300 steps on cuda:0 and on the host, and PyTorch's twin on the
# GPU; fails when cuda:0's validation loss is more than 0.02 from the
# host's (GPU_CHECK.md says why that bound).
run_fortunes() {
    if [ -z "$FORTUNES" ]; then
        row fortunes skipped 0 "no fortunes (run tests/gpu/prepare.sh and carry _gpu)"
        return
    fi
    local meta
    mapfile -t meta < <(py_meta)
    pystep fortunes 150 chorus-train -- fortunes --device cuda:0 \
        --chorus-train "$CHORUS_ENV $B/chorus-train" --data "$FORTUNES" \
        --fortune-steps 300 --tolerance 0.02 "${meta[@]}"
    py_block fortunes "fortunes: validation loss after 300 steps, cuda:0, host, PyTorch on the GPU"
}

# The fused attention alone, then the training steps beside PyTorch's:
# the comparisons take what the budget has left, less a little for
# memcheck; side_by_side.py leaves out (partial) what does not fit.
run_side_by_side() {
    local meta left
    mapfile -t meta < <(py_meta)
    pystep attention 90 bench-train -- attention --device cuda:0 \
        --ours "$CHORUS_ENV $B/bench-train" "${meta[@]}"
    py_block attention "attention alone: ch_attention_packed_mixed against PyTorch's SDPA, cuda:0"
    left=$((BUDGET - $(elapsed) - RESERVE - 30))
    pystep side-by-side "$((left > 1 ? left : 1))" bench-train -- train --device cuda:0 \
        --ours "$CHORUS_ENV $B/bench-train" "${meta[@]}"
    py_block side-by-side "side by side: ours against PyTorch on cuda:0 (side-by-side.json)"
}

# compute-sanitizer's memcheck over test-ops on cuda:0 (and the host, which
# its comparisons of the random streams and shared formulas need): optional,
# last, with whatever time is left (up to three minutes). Cut short by
# that limit it is "partial", which fails nothing: it reports what it
# checked; an error it found before the cut still fails the run.
run_sanitizer() {
    if [ -z "$SANITIZER" ]; then
        row memcheck skipped 0 "no compute-sanitizer on this machine"
        return
    fi
    [ "$NCUDA" -lt 1 ] && { row memcheck skipped 0 "no GPU"; return; }
    built test-ops || { row memcheck skipped 0 "test-ops not built"; return; }
    out_of_time && { row memcheck skipped 0 "no time left in the budget"; return; }
    local lim t0 rc errs
    lim=$(limit 180)
    t0=$(date +%s)
    CHORUS_DEVICES=host,cuda:0 timeout -k 5 "$lim" "$SANITIZER" --tool memcheck --error-exitcode 97 \
        --print-limit 20 "$B/test-ops" >"$OUTDIR/sanitizer.log" 2>&1
    rc=$?
    errs=$(grep -m 1 -E 'ERROR SUMMARY: [0-9]+' "$OUTDIR/sanitizer.log" || true)
    case $rc in
    0) row memcheck ok $(($(date +%s) - t0)) "${errs:-no errors}; $(tap_counts "$OUTDIR/sanitizer.log")" ;;
    124 | 137)
        # Cut before its ERROR SUMMARY: the errors it printed so far, one
        # "=========" block each, start with these words.
        local found
        found=$(grep -cE '^========= +(Invalid |Program hit |Malloc/Free error|Leaked |Uninitialized |Misaligned |Out-of-range |Barrier error|Error: )' \
            "$OUTDIR/sanitizer.log")
        if [ "${found:-0}" -gt 0 ]; then
            row memcheck FAILED $(($(date +%s) - t0)) "cut at ${lim}s after $found error(s); see sanitizer.log"
        else
            row memcheck partial $(($(date +%s) - t0)) "cut at ${lim}s by the budget, no error so far: $(tap_counts "$OUTDIR/sanitizer.log")"
        fi
        ;;
    *) row memcheck FAILED $(($(date +%s) - t0)) "exit $rc; ${errs:-see sanitizer.log}" ;;
    esac
}

# Whether CHECK_PARTS (default: all of them) names this part.
part() {
    case " ${CHECK_PARTS:-tests train opencl fortunes benches side-by-side sanitizer} " in
    *" $1 "*) return 0 ;;
    *) row "$1" skipped 0 "not in CHECK_PARTS" && return 1 ;;
    esac
}

# ---- summary ----------------------------------------------------------------

summary() {
    {
        # What the run was on, first: the GPU, its driver and the CUDA
        # versions (the driver's and the toolkit's that built the module).
        log "GPU:      ${GPU_NAME:-none seen by nvidia-smi}${GPU:+ ($GPU)}"
        log "driver:   ${DRIVER:-none}${DRIVER_CUDA:+, supports CUDA $DRIVER_CUDA}"
        log "CUDA:     toolkit ${TOOLKIT:-none (no nvcc)}"
        log "Chorus GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), $(elapsed) s of a $BUDGET s budget"
        log "source:   $(git -C "$SRC" log -1 --format='%h %s' 2>/dev/null || echo "$SRC")"
        log "library:  sees $NCUDA CUDA device(s)${CUDA_WHY:+ ($CUDA_WHY)}"
        log "opencl:   ${OCL_DESC:-none: $OCL_WHY}"
        log "PyTorch:  ${TORCH:-python3 cannot import torch}"
        if [ -s "$OUTDIR/side-by-side.json" ]; then
            log "results:  $OUTDIR/side-by-side.json (copy it to docs/gpu/side-by-side.json)"
        else
            log "results:  no side-by-side.json (it appears after a run on a GPU with PyTorch)"
        fi
        log "toolkit:  ${NVCC:-no nvcc}, arch $CUDA_ARCH; cuBLAS ${CUBLAS_SO:-none}; NCCL ${NCCL_SO:-none}; cudart ${CUDART##*/}"
        log "carried:  $CARRY_USED"
        log "build:    $(grep -c 'warning:' "$OUTDIR/build.log" 2>/dev/null) compiler warnings (build.log)"
        local n
        for n in ${NOTES[@]+"${NOTES[@]}"}; do log "note:     $n"; done
        log ""
        printf '%-18s %-8s %5s  %s\n' step result secs detail
        printf '%s\n' "${ROWS[@]}"
        if [ -s "$B/failures" ]; then
            log ""
            log "First failures (the full output is in tests.log):"
            cat "$B/failures"
        fi
        [ -s "$B/benchmarks" ] && { log ""; log "Benchmarks (bench.log has everything):"; cat "$B/benchmarks"; }
    } >"$OUTDIR/summary.txt"
}

main() {
    local t0
    rm -f "$OUTDIR"/{summary.txt,probe.log,build.log,tests.log,bench.log,train.log,sanitizer.log,side-by-side.json}
    : >"$OUTDIR/tests.log"
    log "Chorus GPU check: source $SRC, build $B, output $OUTDIR, budget ${BUDGET}s"

    t0=$(date +%s)
    { probe; carried; } >"$OUTDIR/probe.log" 2>&1
    if [ -n "$NVCC" ] && [ -n "$CUBLAS_SO" ] && [ -n "$CUDART" ]; then
        row probe ok $(($(date +%s) - t0)) "${GPU:-no GPU}; arch $CUDA_ARCH; NCCL $([ -n "$NCCL_SO" ] && echo yes || echo no)"
    else
        row probe FAILED $(($(date +%s) - t0)) "no nvcc, cuBLAS or cudart: see probe.log"
    fi

    t0=$(date +%s)
    local state rc lim
    state=$(mktemp) || return 1
    declare -p SRC B CARRY NVCC CUDA_HOME CUDA_ARCH CUBLAS_SO CUBLASLT_SO CUBLAS_INC NCCL_SO NCCL_INC CUDART \
        LIBDIRS ZINC JINC ZLIB JLIB CLINC CLLIB CLBLAST_INC CLBLAST_LIB >"$state"
    lim=$(limit $((BUDGET * 3 / 5)))
    timeout -k 5 "$lim" bash "$SELF" --build "$state" >"$OUTDIR/build.log" 2>&1
    rc=$?
    rm -f "$state"
    if [ $rc -eq 0 ]; then
        row build ok $(($(date +%s) - t0)) "$(tail -n 1 "$OUTDIR/build.log")"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        row build TIMEOUT $(($(date +%s) - t0)) "cut at ${lim}s; see build.log"
    else
        row build FAILED $(($(date +%s) - t0)) "see build.log; $(grep -m 1 'BUILD FAILED' "$OUTDIR/build.log" || tail -n 1 "$OUTDIR/build.log")"
    fi
    mkdir -p "$B" && : >"$B/failures" && : >"$B/benchmarks"

    export CHORUS_BACKEND_PATH="$B/mod"
    # The carried libraries the system lacks (copied by the build).
    local ld="$B" d
    [ -d "$CARRIED_LIBS" ] && ld="$ld:$CARRIED_LIBS"
    for d in $(printf '%s\n' ${LIBDIRS[@]+"${LIBDIRS[@]}"} | awk '!seen[$0]++'); do ld="$ld:$d"; done
    export LD_LIBRARY_PATH="$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    unset CHORUS_DEVICES CHORUS_CUDA_NCCL CHORUS_TEST_DEVICES
    log "CHORUS_BACKEND_PATH=$CHORUS_BACKEND_PATH LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >>"$OUTDIR/tests.log"
    write_chorus_env

    cuda_devices
    if [ "$NCUDA" -gt 0 ]; then
        row cuda-backend ok 0 "$NCUDA CUDA device(s)"
    elif [ -n "$GPU" ]; then
        row cuda-backend FAILED 0 "nvidia-smi sees a GPU, the library none: ${CUDA_WHY:-?}"
    else
        row cuda-backend skipped 0 "no GPU${CUDA_WHY:+ ($CUDA_WHY)}"
    fi
    opencl_setup
    part tests && run_tests
    part train && run_train
    part opencl && run_opencl
    part fortunes && run_fortunes
    part benches && run_benches
    part side-by-side && run_side_by_side
    part sanitizer && run_sanitizer
    summary
    log ""
    cat "$OUTDIR/summary.txt"
    return $FAILED
}

# The build runs as a child of its own, so that one time limit covers it
# and every compiler it starts.
if [ "${1:-}" = --build ] && [ $# -eq 2 ]; then
    # shellcheck disable=SC1090
    . "$2"
    build
    exit
fi
if [ $# -ne 1 ]; then
    echo "usage: tests/gpu/check.sh OUTDIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 2
OUTDIR=$(cd "$1" && pwd)
main
