#!/bin/sh
# chorus-train across MPI processes against one process holding the same
# replicas: for K = 1 .. N (default 3), one process with K host replicas
# (--devices host,host,...) and, for K >= 2, K processes of one host
# replica each under mpirun. The cnn, one epoch of LIMIT samples (default
# 30000), batch 64, equal split, one OpenMP thread per process; ROUNDS
# rounds (default 3) interleaved, the median samples/s of each setup and
# the ratio of the processes to the one process. From the build folder:
#     bench/bench-ranks.sh [N]
# Environment: MPIRUN (default mpirun), ROUNDS, LIMIT, CHORUS_TRAIN
# (default ./utils/chorus-train), CHORUS_TEST_DATA (Fashion-MNIST's folder).
set -u
n=${1:-3}
case $n in
'' | *[!0-9]*) echo "bench-ranks.sh: N must be a number of processes, got \"$n\"" >&2; exit 2 ;;
esac
rounds=${ROUNDS:-3} limit=${LIMIT:-30000}
train=${CHORUS_TRAIN:-./utils/chorus-train}
mpirun=${MPIRUN:-mpirun}
data=${CHORUS_TEST_DATA:-/usr/share/datasets/fashion-mnist}
[ -x "$train" ] || { echo "bench-ranks.sh: no $train (run it from a build folder)" >&2; exit 2; }
command -v "$mpirun" >/dev/null 2>&1 || { echo "bench-ranks.sh: no $mpirun" >&2; exit 2; }
tmp=${TMPDIR:-/tmp}/bench-ranks.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
opts="--model cnn --data $data --epochs 1 --limit $limit --batch 64 --split equal --quiet --json"
export OMP_NUM_THREADS=1

# One run of setup $1 (a name) by command $2...; its samples/s appended to
# $tmp/$1.
one() {
    name=$1
    shift
    if ! "$@" >"$tmp/out" 2>"$tmp/err"; then
        echo "bench-ranks.sh: $name failed:" >&2
        tail -5 "$tmp/err" >&2
        exit 1
    fi
    sed -n 's/.*"samples_per_s":\([0-9.]*\).*/\1/p' "$tmp/out" | tail -n 1 >>"$tmp/$name"
}

median() {
    sort -n "$tmp/$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

r=1
while [ "$r" -le "$rounds" ]; do
    k=1 devs=host
    while [ "$k" -le "$n" ]; do
        # shellcheck disable=SC2086 # the options are words
        one "one-$k" "$train" --devices "$devs" $opts
        if [ "$k" -ge 2 ]; then
            # shellcheck disable=SC2086
            one "mpi-$k" "$mpirun" --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS -np "$k" \
                "$train" --devices host $opts
        fi
        k=$((k + 1)) devs="$devs,host"
    done
    r=$((r + 1))
done

echo "| setup | samples/s | ratio |"
echo "| --- | ---: | ---: |"
k=1 devs=host
while [ "$k" -le "$n" ]; do
    one_sps=$(median "one-$k")
    echo "| 1 process, $devs | $one_sps | - |"
    if [ "$k" -ge 2 ]; then
        mpi_sps=$(median "mpi-$k")
        echo "| $k processes of host (mpirun) | $mpi_sps | **$(awk -v a="$mpi_sps" -v b="$one_sps" 'BEGIN { printf "%.2f", a / b }')** |"
    fi
    k=$((k + 1)) devs="$devs,host"
done
