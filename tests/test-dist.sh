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
# Under --enable-sanitizers: whole allocation stacks, so that the
# suppressions of Open MPI's own leaks (LSAN_OPTIONS, set by make check)
# match; other builds ignore both. mpirun passes them on with -x.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
LSAN_OPTIONS=${LSAN_OPTIONS:-}
export ASAN_OPTIONS LSAN_OPTIONS
run() {
    mpirun_tap "$1" "$1 ranks ($2)" "$tmp/out" "$tmp/err" "$prog" "$2"
}

run 2 "$two"
run 3 "$three"

# chorus-info under mpirun: rank 0 prints every process's devices.
info=$builddir/utils/chorus-info
timeout 300 "$mpirun" --allow-run-as-root --oversubscribe -x ASAN_OPTIONS -x LSAN_OPTIONS \
    -np 2 "$info" >"$tmp/info.out" 2>"$tmp/info.err" &&
    grep -q '^== rank 0 of 2 (local rank 0 of 2) on ' "$tmp/info.out" &&
    grep -q '^== rank 1 of 2 (local rank 1 of 2) on ' "$tmp/info.out" &&
    test "$(grep -c '^Devices (' "$tmp/info.out")" -eq 2
ok $? "chorus-info under mpirun -np 2: each rank's devices under its heading"
timeout 300 "$mpirun" --allow-run-as-root --oversubscribe -x ASAN_OPTIONS -x LSAN_OPTIONS \
    -np 2 "$info" --json >"$tmp/info.json" 2>"$tmp/info.err" && python3 -c '
import json, sys
ranks = json.load(open(sys.argv[1]))
assert [r["rank"] for r in ranks] == [0, 1], ranks
assert all(r["ranks"] == 2 and r["devices"][0]["id"] == "host" for r in ranks), ranks
' "$tmp/info.json"
ok $? "chorus-info --json under mpirun -np 2: an array of one object per rank"

# chorus-train under mpirun, on a subset of Fashion-MNIST.
train=$builddir/utils/chorus-train
data=${CHORUS_TEST_DATA:-/usr/share/datasets/fashion-mnist}
if [ ! -r "$data/train-images-idx3-ubyte.gz" ] && [ ! -r "$data/train-images-idx3-ubyte" ]; then
    skip "no Fashion-MNIST in $data: chorus-train under mpirun not tried"
    tap_done
fi
# One OpenMP thread per process, in every run: the host's per-thread
# partial sums make its bits depend on the thread count, and mpirun binds
# each rank to one core while a process alone would take both.
OMP_NUM_THREADS=1
export OMP_NUM_THREADS
mpi="$mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS -x ASAN_OPTIONS -x LSAN_OPTIONS"
quick="--data $data --model cnn --limit 2000 --batch 50 --split equal --quiet"

# shellcheck disable=SC2086
timeout 600 $mpi -np 2 "$train" $quick --devices host --epochs 2 --checkpoint "$tmp/two.st" \
    >"$tmp/two.out" 2>"$tmp/two.err"
ok $? "mpirun -np 2 chorus-train: 2 epochs (stderr: $(tail -c 300 "$tmp/two.err" | tr '\n#' '  '))"
test "$(grep -c '^result ' "$tmp/two.out")" -eq 1 &&
    grep -Eq '^result test_accuracy=0\.[0-9]+ .* devices=host ranks=2$' "$tmp/two.out"
ok $? "rank 0 alone prints the result, with ranks=2: $(cat "$tmp/two.out")"

# Two processes of one host replica each are the replicas host,host of one
# process: the same split, and a sum of two in either order.
# shellcheck disable=SC2086
"$train" $quick --devices host,host --epochs 2 --checkpoint "$tmp/one.st" >/dev/null 2>&1 &&
    cmp -s "$tmp/one.st" "$tmp/two.st"
ok $? "2 ranks of host train the bits of one process on host,host"

# Gradients reduced in bf16: across the two processes each total crosses
# rounded to bf16 and the sum is rounded once (ch_dist_sum_bf16), which is
# what one process does with host,host reduced through the host (--reduce
# host; auto would sum the two host replicas as one peer group, in f32):
# the same bits again, not f32's.
# shellcheck disable=SC2086
timeout 600 $mpi -np 2 "$train" $quick --devices host --epochs 2 --reduce-dtype bf16 \
    --checkpoint "$tmp/two16.st" >"$tmp/two16.out" 2>"$tmp/two16.err" &&
    "$train" $quick --devices host,host --epochs 2 --reduce-dtype bf16 --reduce host \
        --checkpoint "$tmp/one16.st" >/dev/null 2>&1 &&
    cmp -s "$tmp/one16.st" "$tmp/two16.st" && ! cmp -s "$tmp/two16.st" "$tmp/two.st"
ok $? "--reduce-dtype bf16: 2 ranks of host train the bits of one process on host,host, other bits than f32 (stderr: $(tail -c 300 "$tmp/two16.err" | tr '\n#' '  '))"

# shellcheck disable=SC2086
timeout 600 $mpi -np 2 "$train" $quick --devices host --epochs 2 --max-steps 57 \
    --checkpoint "$tmp/mid.st" >/dev/null 2>&1 &&
    "$train" $quick --devices host,host --epochs 2 --resume "$tmp/mid.st" \
        --checkpoint "$tmp/resumed1.st" >/dev/null 2>&1 &&
    cmp -s "$tmp/resumed1.st" "$tmp/two.st"
ok $? "a 2-rank job stopped at step 57 resumes in 1 process to the bits of the straight run"
# shellcheck disable=SC2086
timeout 600 $mpi -np 3 "$train" $quick --devices host --epochs 2 --resume "$tmp/mid.st" \
    --checkpoint "$tmp/resumed3.st" >"$tmp/r3.out" 2>"$tmp/r3.err"
status=$?
# shellcheck disable=SC2086
timeout 600 $mpi -np 3 "$train" $quick --devices host --epochs 2 >"$tmp/s3.out" 2>/dev/null
got=$(sed -n 's/^result test_accuracy=[0-9.]* test_loss=\([0-9.]*\) .*/\1/p' "$tmp/r3.out")
want=$(sed -n 's/^result test_accuracy=[0-9.]* test_loss=\([0-9.]*\) .*/\1/p' "$tmp/s3.out")
test $status -eq 0 && awk -v a="${got:-0}" -v b="${want:-1}" \
    'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 0.002 * b) }'
ok $? "... and in 3 ranks, to the test loss of 3 ranks straight through ($got against $want)"

# The sharded optimizer (ZeRO stage 1) under mpirun: each rank keeps its
# part of Adam's state, and the job trains the unsharded job's bits; its
# checkpoints are whole, the same file, and resume anywhere.
# shellcheck disable=SC2086
timeout 600 $mpi -np 2 "$train" $quick --devices host --epochs 2 --shard-optimizer \
    --checkpoint "$tmp/two-sh.st" >"$tmp/two-sh.out" 2>"$tmp/two-sh.err" &&
    cmp -s "$tmp/two-sh.st" "$tmp/two.st"
ok $? "--shard-optimizer: 2 ranks train the bits of 2 ranks unsharded, the checkpoint's optimizer state included (stderr: $(tail -c 300 "$tmp/two-sh.err" | tr '\n#' '  '))"
# shellcheck disable=SC2086
timeout 600 $mpi -np 2 "$train" $quick --devices host --epochs 2 --max-steps 57 \
    --shard-optimizer --checkpoint "$tmp/mid-sh.st" >/dev/null 2>&1 &&
    cmp -s "$tmp/mid-sh.st" "$tmp/mid.st"
ok $? "... stopped at step 57, its checkpoint is the unsharded job's, byte for byte"
# shellcheck disable=SC2086
"$train" $quick --devices host,host --epochs 2 --resume "$tmp/mid-sh.st" \
    --checkpoint "$tmp/resumed1-sh.st" >/dev/null 2>&1 &&
    cmp -s "$tmp/resumed1-sh.st" "$tmp/two.st"
ok $? "... it resumes in 1 process, unsharded, to the bits of the straight run"
# shellcheck disable=SC2086
# Over 3 ranks the sharded job's gradients cross in a reduce-scatter that
# adds the ranks' totals in rank order, the unsharded job's in MPI's
# all-reduce, in its own order: the last bits may differ, the test loss not.
timeout 600 $mpi -np 3 "$train" $quick --devices host --epochs 2 --resume "$tmp/mid-sh.st" \
    --shard-optimizer --checkpoint "$tmp/resumed3-sh.st" >"$tmp/r3-sh.out" 2>"$tmp/r3-sh.err"
status=$?
got=$(sed -n 's/^result test_accuracy=[0-9.]* test_loss=\([0-9.]*\) .*/\1/p' "$tmp/r3-sh.out")
want=$(sed -n 's/^result test_accuracy=[0-9.]* test_loss=\([0-9.]*\) .*/\1/p' "$tmp/r3.out")
test $status -eq 0 && awk -v a="${got:-0}" -v b="${want:-1}" \
    'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 0.001 * b) }'
ok $? "... and in 3 ranks, sharded, to the test loss of the unsharded 3-rank resume ($got against $want; stderr: $(tail -c 300 "$tmp/r3-sh.err" | tr '\n#' '  '))"

# --devices LIST;LIST: each process of the machine its own list, by local
# rank (rank 1 holds two host replicas here, so three replicas train).
# shellcheck disable=SC2086
timeout 600 $mpi -np 2 "$train" $quick --devices "host;host,host" --epochs 1 --log "$tmp/lists.log" \
    >"$tmp/lists.out" 2>"$tmp/lists.err"
status=$?
grep -Eq '^result test_accuracy=0\.[0-9]+ .* devices=host ranks=2$' "$tmp/lists.out" &&
    python3 -c '
import json, sys
first = json.loads(open(sys.argv[1]).readline())
# 50 samples over the job'"'"'s three replicas: 17, 17 and 16.
assert [(d["id"], d["samples"]) for d in first["devices"]] == [("host", 17)], first
' "$tmp/lists.log"
ok $((status + $?)) "--devices \"host;host,host\" under mpirun: rank 0 trains on host, 17 of each 50 samples, so rank 1 holds two replicas (status $status)"

# A rank killed in the middle: the job ends, non-zero, naming rank 1.
cat >"$tmp/rank.sh" <<'SH'
#!/bin/sh
# Under mpirun: record this rank's pid, then become the program.
echo $$ >"$RANK_DIR/pid.${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}"
exec "$@"
SH
chmod +x "$tmp/rank.sh"
# Wait (up to 60 s) for rank 1 to have started, then 2 s more: it is then
# training, or joining the others.
rank1_started() {
    i=0
    while [ ! -s "$tmp/pid.1" ] && [ $i -lt 600 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    sleep 2
}
long="--data $data --model cnn --limit 20000 --batch 50 --epochs 3 --devices host --quiet"
start=$(date +%s)
# shellcheck disable=SC2086
RANK_DIR=$tmp timeout 300 $mpi -np 2 -x RANK_DIR "$tmp/rank.sh" "$train" $long \
    >"$tmp/kill.out" 2>"$tmp/kill.err" &
job=$!
rank1_started
kill -9 "$(cat "$tmp/pid.1" 2>/dev/null)" 2>/dev/null
wait $job
status=$?
took=$(($(date +%s) - start))
test $status -ne 0 && test $took -lt 180 && grep -q 'rank 1' "$tmp/kill.err"
ok $? "rank 1 killed: the job exits $status after ${took}s naming rank 1 ($(grep -m1 'rank 1' "$tmp/kill.err"))"

# A rank that stops answering: the others' watchdog ends the job.
rm -f "$tmp"/pid.*
start=$(date +%s)
# shellcheck disable=SC2086
CHORUS_DIST_TIMEOUT=5 RANK_DIR=$tmp timeout 300 $mpi -np 2 -x RANK_DIR -x CHORUS_DIST_TIMEOUT \
    "$tmp/rank.sh" "$train" $long >"$tmp/stop.out" 2>"$tmp/stop.err" &
job=$!
rank1_started
kill -STOP "$(cat "$tmp/pid.1" 2>/dev/null)" 2>/dev/null
wait $job
status=$?
took=$(($(date +%s) - start))
kill -9 "$(cat "$tmp/pid.1" 2>/dev/null)" 2>/dev/null
test $status -ne 0 && test $took -lt 120 && grep -q 'rank 0 of 2 waited 5 s.*rank 1 did not answer' "$tmp/stop.err"
ok $? "rank 1 stopped: rank 0's watchdog ends the job after ${took}s ($(grep -m1 'waited' "$tmp/stop.err"))"

# chorus-elastic, the supervised launch: 3 ranks, rank 2 killed
# mid-epoch after the first periodic checkpoint; the job restarts on 2
# ranks from the last checkpoint (the same global batch) and finishes, to
# the test accuracy of the uninterrupted 3-rank run within 0.005.
elastic="$(dirname "$0")/../utils/chorus-elastic"
el="--data $data --model cnn --limit 6000 --batch 50 --epochs 2 --split equal --devices host --quiet"
# shellcheck disable=SC2086
timeout 600 $mpi -np 3 "$train" $el >"$tmp/el-straight.out" 2>/dev/null
rm -f "$tmp"/pid.* "$tmp/el.st"
start=$(date +%s)
# shellcheck disable=SC2086
RANK_DIR=$tmp CHORUS_LAUNCHER="$mpi -x RANK_DIR -np {n}" timeout 900 "$elastic" -n 3 \
    --restarts 2 -- "$tmp/rank.sh" "$train" $el --checkpoint-every 10 --checkpoint "$tmp/el.st" \
    >"$tmp/el.out" 2>"$tmp/el.err" &
job=$!
i=0
while { [ ! -s "$tmp/pid.2" ] || [ ! -f "$tmp/el.st" ]; } && kill -0 $job 2>/dev/null &&
    [ $i -lt 3000 ]; do
    sleep 0.1
    i=$((i + 1))
done
kill -9 "$(cat "$tmp/pid.2" 2>/dev/null)" 2>/dev/null
wait $job
status=$?
took=$(($(date +%s) - start))
got=$(sed -n 's/^result test_accuracy=\([0-9.]*\) .*ranks=2$/\1/p' "$tmp/el.out")
want=$(sed -n 's/^result test_accuracy=\([0-9.]*\) .*ranks=3$/\1/p' "$tmp/el-straight.out")
test $status -eq 0 && grep -q 'restart 1 of 2 on 2 processes, resuming from' "$tmp/el.err" &&
    awk -v a="${got:-0}" -v b="${want:-1}" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 0.005) }'
ok $? "chorus-elastic: rank 2 of 3 killed mid-epoch, the job restarts on 2 ranks from its last checkpoint and finishes in ${took}s (status $status, test accuracy ${got:-none} against ${want:-none} uninterrupted; $(grep -m1 'restart 1' "$tmp/el.err" | cut -c1-160))"

# A rank that cannot read its data ends the job, and says why.
cat >"$tmp/bad.sh" <<'SH'
#!/bin/sh
# Rank 1 is given a data folder that does not exist.
if [ "${OMPI_COMM_WORLD_RANK:-0}" = 1 ]; then
    exec "$@" --data /nonexistent-chorus-data
fi
exec "$@"
SH
chmod +x "$tmp/bad.sh"
start=$(date +%s)
# shellcheck disable=SC2086
timeout 300 $mpi -np 2 "$tmp/bad.sh" "$train" $long >"$tmp/bad.out" 2>"$tmp/bad.err"
status=$?
took=$(($(date +%s) - start))
test $status -ne 0 && test $took -lt 120 && grep -q 'nonexistent-chorus-data' "$tmp/bad.err"
ok $? "rank 1 without its data: the job exits $status after ${took}s with its error"
tap_done
