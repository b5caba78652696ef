#!/bin/sh
# chorus-train --elastic end to end, over the host and the two devices of
# the test module whose devices fail on command (tests/flaky-module.c),
# flaky:1 armed by CHORUS_FLAKY to fail partway through training: without
# --elastic the run fails naming the device; with it the run completes on
# the two devices left, says so on stderr, in --log and in --json, and
# trains the bits of the run that lost nothing (the host reduction's sum
# is the same for every device mix); a device that hangs is dropped after
# --elastic-timeout; bad combinations are usage errors (exit 2). No
# OpenCL: the host and the flaky devices alone.
train=${CHORUS_TRAIN:-./utils/chorus-train}
data=${CHORUS_TEST_DATA:-/usr/share/datasets/fashion-mnist}
builddir=${CHORUS_TEST_BUILDDIR:-.}
flaky=${CHORUS_TEST_FLAKY_DIR:-$builddir/tests/flaky/.libs}
tmp=${TMPDIR:-/tmp}/test-train-elastic.$$
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

if [ ! -r "$data/train-images-idx3-ubyte.gz" ] && [ ! -r "$data/train-images-idx3-ubyte" ]; then
    echo "1..0 # SKIP no Fashion-MNIST in $data (install dataset-fashion-mnist)"
    exit 0
fi
if [ ! -f "$flaky/chorus-flaky.so" ]; then
    echo "1..0 # SKIP the flaky test module is not built in $flaky (make check builds it)"
    exit 0
fi
if ! command -v python3 >/dev/null 2>&1; then
    echo "1..0 # SKIP python3 is missing (needed to parse the JSON)"
    exit 0
fi

. "$(dirname "$0")/tap.sh"

# The flaky module's devices beside the host, and nothing else (no OpenCL
# to start); every device visible whatever the caller restricts.
CHORUS_BACKEND_PATH=$flaky
export CHORUS_BACKEND_PATH
unset CHORUS_DEVICES CHORUS_FLAKY

# The mlp on 2000 samples, 2 epochs of 40 steps over three replicas with
# the host reduction (the same bits for every device mix). flaky:1 counts
# about 100 backend calls a step: its call 1500 comes in about step 15 of
# 80 (the test checks that it lands mid-run).
quick="--data $data --devices host,flaky:0,flaky:1 --model mlp --limit 2000 --batch 50 --epochs 2 --reduce host --quiet"
fail_at=1500
# The module's notes (ops it runs on the host) left out of what is shown.
shown() { grep -v ' has no ' "$1" | head -c "${2:-400}" | tr '\n#' '  '; }

# The straight run: nothing lost.
# shellcheck disable=SC2086
"$train" $quick --json --log "$tmp/straight.jsonl" >"$tmp/straight.json" 2>"$tmp/straight.err"
status=$?
ref=$(python3 -c 'import json, sys; print("%.4f" % json.load(open(sys.argv[1]))["test_accuracy"])' \
    "$tmp/straight.json" 2>/dev/null)
test "$status" -eq 0 && test -n "$ref"
ok $? "host,flaky:0,flaky:1 train 2 epochs with nothing lost (status $status, test accuracy ${ref:-none}; $(shown "$tmp/straight.err"))"

# Without --elastic: flaky:1 lost ends the run (exit 1), naming it.
# shellcheck disable=SC2086
CHORUS_FLAKY="1:$fail_at" "$train" $quick >"$tmp/plain.out" 2>"$tmp/plain.err"
status=$?
test "$status" -eq 1 && grep -q 'chorus-train: training failed: .*flaky:1' "$tmp/plain.err" &&
    ! grep -q '^result ' "$tmp/plain.out"
ok $? "without --elastic, flaky:1 failing at its call $fail_at ends the run: status $status, $(grep '^chorus-train' "$tmp/plain.err" | head -c 300)"

# With --elastic: the run goes on over host and flaky:0; stderr says at
# which step flaky:1 was lost, why, and what trains on.
# shellcheck disable=SC2086
CHORUS_FLAKY="1:$fail_at" "$train" $quick --elastic >"$tmp/el.out" 2>"$tmp/el.err"
status=$?
line=$(grep '^chorus-train: step [0-9]*: flaky:1 lost' "$tmp/el.err")
echo "# stderr: $line"
echo "# stdout: $(cat "$tmp/el.out")"
test "$status" -eq 0 &&
    printf '%s\n' "$line" | grep -Eq '^chorus-train: step [0-9]+: flaky:1 lost \(replica 2 on flaky:1: flaky:1: the device was lost .*\); training on 2 replicas: host, flaky:0 \([0-9.]+ s\)$' &&
    test "$(grep -c ' lost ' "$tmp/el.err")" -eq 1 && ! grep -q 'rejoined' "$tmp/el.err"
ok $? "--elastic: flaky:1 lost, one line on stderr names the step, the cause and the 2 replicas left (status $status: $(shown "$tmp/el.err"))"
step=$(printf '%s\n' "$line" | sed -n 's/^chorus-train: step \([0-9]*\): .*/\1/p')
test -n "$step" && [ "$step" -gt 1 ] && [ "$step" -lt 80 ]
ok $? "flaky:1 was lost mid-run: in step ${step:-none} of 80"
grep -Eq "^result test_accuracy=$ref test_loss=[0-9.]+ samples_per_s=[0-9.]+ epochs=2 devices=host,flaky:0,flaky:1 replicas=2\$" "$tmp/el.out"
ok $? "the result line as usual, with replicas=2, and the straight run's test accuracy $ref: $(cat "$tmp/el.out")"

# --json and --log: the device_lost record, with its step.
# shellcheck disable=SC2086
CHORUS_FLAKY="1:$fail_at" "$train" $quick --elastic --json --log "$tmp/el.jsonl" \
    >"$tmp/el.json" 2>"$tmp/elj.err"
status=$?
echo "# --json changes: $(python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1])).get("changes")))' "$tmp/el.json" 2>&1)"
echo "# --log event: $(grep '"event"' "$tmp/el.jsonl")"
test "$status" -eq 0 && python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
ref = float(sys.argv[2])
assert abs(d["test_accuracy"] - ref) < 5e-5, (d["test_accuracy"], ref)
assert d["steps"] == 80 and d["replicas"] == 2, d
(c,) = d["changes"]
assert c["event"] == "device_lost" and c["device"] == "flaky:1" and c["when"] == "training", c
assert 1 < c["step"] < 80 and c["replicas"] == 2 and c["devices"] == ["host", "flaky:0"], c
assert "flaky:1" in c["cause"] and c["seconds"] >= 0, c
lost = [x for x in d["breakdown"]["devices"] if x.get("lost")]
assert [x["id"] for x in lost] == ["flaky:1"], d["breakdown"]
' "$tmp/el.json" "$ref"
ok $? "--json: the result holds replicas 2 and the device_lost record with its step; the breakdown marks flaky:1 lost (status $status: $(head -c 400 "$tmp/el.json"))"
python3 -c '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
events = [r for r in recs if "event" in r]
steps = [r for r in recs if "event" not in r]
(e,) = events
assert e["event"] == "device_lost" and e["device"] == "flaky:1", e
assert [r["step"] for r in steps] == list(range(1, 81)), [r["step"] for r in steps]
at = recs.index(e)
# The event comes before the line of the step it happened in.
assert recs[at + 1]["step"] == e["step"], (recs[at + 1]["step"], e["step"])
for r in steps:
    ids = [x["id"] for x in r["devices"]]
    want = ["host", "flaky:0", "flaky:1"] if r["step"] < e["step"] else ["host", "flaky:0"]
    assert ids == want and r["replicas"] == len(want), (r["step"], ids, r["replicas"])
    # The step the device was lost in is made again over the two left, or,
    # when its update had held on both, kept: its measurements then went
    # with the replicas made again (no samples).
    samples = sum(x["samples"] for x in r["devices"])
    assert samples == 50 or (r["step"] == e["step"] and samples == 0), r
# Every step has the loss of the straight run, up to the rounding of its
# sum over other shares.
straight = [json.loads(l) for l in open(sys.argv[2])]
assert len(straight) == 80
for a, b in zip(straight, steps):
    assert abs(a["loss"] - b["loss"]) <= 1e-5, ("step", a["step"], a["loss"], b["loss"])
' "$tmp/el.jsonl" "$tmp/straight.jsonl"
ok $? "--log: the device_lost event line before its step; the steps before it on 3 replicas, from it on 2 (epoch 2 too: nothing rejoined); every step's loss the straight run's +- 1e-5"

# A device that stops answering (its call blocks): dropped once a call
# has run --elastic-timeout 0.5 s and it does not answer a probe, not
# after the default minute.
# shellcheck disable=SC2086
CHORUS_FLAKY="1:$fail_at:hang" timeout 300 "$train" $quick --elastic --elastic-timeout 0.5 --json \
    >"$tmp/hang.json" 2>"$tmp/hang.err"
status=$?
echo "# hang: $(grep ' lost ' "$tmp/hang.err")"
test "$status" -eq 0 && python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert abs(d["test_accuracy"] - float(sys.argv[2])) < 5e-5, d["test_accuracy"]
(c,) = d["changes"]
assert c["device"] == "flaky:1" and "no answer within 0.5 s" in c["cause"], c
assert c["seconds"] < 10 and c["replicas"] == 2, c
' "$tmp/hang.json" "$ref"
ok $? "--elastic-timeout 0.5: flaky:1 hanging is dropped within seconds, the run completes with the same accuracy (status $status: $(shown "$tmp/hang.err" 300))"

# Usage errors: exit 2 with a message, before any training.
usage() {
    want=$1
    shift
    "$train" --data "$data" --devices host --model mlp --limit 100 --epochs 1 --quiet "$@" \
        >"$tmp/u.out" 2>"$tmp/u.err"
    status=$?
    test "$status" -eq 2 && grep -q -- "$want" "$tmp/u.err"
    ok $? "$* exits 2 saying \"$want\" (status $status: $(head -c 300 "$tmp/u.err" | tr '\n#' '  '))"
}
usage '--elastic-timeout needs --elastic' --elastic-timeout 5
usage 'leave out --shard-optimizer' --elastic --shard-optimizer
usage 'use --accumulate 1' --elastic --accumulate 2
usage '--elastic-timeout wants a number of seconds > 0, not "0"' --elastic --elastic-timeout 0
usage '--elastic-timeout wants a number of seconds > 0, not "-1"' --elastic --elastic-timeout -1
usage '--elastic-timeout wants a number of seconds > 0, not "soon"' --elastic --elastic-timeout soon
usage '--elastic-timeout wants a number of seconds > 0, not "inf"' --elastic --elastic-timeout inf

"$train" --help >"$tmp/help" 2>&1
status=$?
test "$status" -eq 0 && grep -q -- '--elastic  ' "$tmp/help" && grep -q -- '--elastic-timeout SECONDS' "$tmp/help"
ok $? "--help describes --elastic and --elastic-timeout (status $status)"

# Under mpirun, more than one process: --elastic is refused (exit 2).
mpirun=${CHORUS_MPIRUN:-}
if [ -n "$mpirun" ] && command -v "$mpirun" >/dev/null 2>&1; then
    # Under --enable-sanitizers the ranks take make check's suppressions
    # of Open MPI's own leaks (as test-dist.sh does): a leak report would
    # change their exit status.
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
    LSAN_OPTIONS=${LSAN_OPTIONS:-}
    export ASAN_OPTIONS LSAN_OPTIONS
    timeout 300 "$mpirun" --allow-run-as-root --oversubscribe -x ASAN_OPTIONS -x LSAN_OPTIONS \
        -np 2 "$train" --data "$data" \
        --devices host --model mlp --limit 100 --epochs 1 --quiet --elastic >"$tmp/mpi.out" 2>"$tmp/mpi.err"
    status=$?
    test "$status" -eq 2 && grep -q 'chorus-train: --elastic works inside one process' "$tmp/mpi.err"
    ok $? "mpirun -np 2 chorus-train --elastic exits 2 (status $status): $(grep '^chorus-train' "$tmp/mpi.err" | head -c 300)"
else
    skip "built without MPI, or no mpirun: --elastic across processes not checked"
fi

tap_done
