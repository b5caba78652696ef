#!/bin/sh
# chorus-train end to end on a subset of Fashion-MNIST: it learns, its
# output and log are well formed, resuming equals training straight through,
# a made-up IDX set is normalised with its own statistics, and bad input
# gives the documented exit codes.
train=${CHORUS_TRAIN:-./utils/chorus-train}
data=${CHORUS_TEST_DATA:-/usr/share/datasets/fashion-mnist}
tmp=${TMPDIR:-/tmp}/test-train.$$
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

if [ ! -r "$data/train-images-idx3-ubyte.gz" ] && [ ! -r "$data/train-images-idx3-ubyte" ]; then
    echo "1..0 # SKIP no Fashion-MNIST in $data (install dataset-fashion-mnist)"
    exit 0
fi

. "$(dirname "$0")/tap.sh"

# Quick settings shared by every run: the mlp on 2000 samples, host only.
quick="--data $data --devices host --model mlp --limit 2000 --batch 50 --quiet"

# shellcheck disable=SC2086
"$train" $quick --epochs 2 --checkpoint "$tmp/straight.st" --log "$tmp/log.jsonl" \
    >"$tmp/out" 2>"$tmp/err"
status=$?
ok $status "2 epochs on 2000 samples run (stderr: $(head -c 200 "$tmp/err" | tr '\n#' '  '))"
acc=$(sed -n 's/^result test_accuracy=\([0-9.]*\) .*/\1/p' "$tmp/out")
awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.70) }'
ok $? "it learns: test accuracy $acc >= 0.70 after 80 steps"
grep -Eq '^result test_accuracy=[0-9.]+ test_loss=[0-9.]+ samples_per_s=[0-9.]+ epochs=2 devices=host$' "$tmp/out"
ok $? "the result line has every key: $(cat "$tmp/out")"
lines=$(wc -l <"$tmp/log.jsonl")
test "$lines" -eq 80 && python3 -c '
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    assert {"step", "epoch", "loss", "samples_per_s", "devices"} <= d.keys(), d
    assert d["devices"][0]["id"] == "host" and d["devices"][0]["time_s"] > 0
' "$tmp/log.jsonl"
ok $? "--log writes one JSON line per step with its keys ($lines lines, want 80)"

# shellcheck disable=SC2086
"$train" $quick --epochs 1 --json >"$tmp/json" 2>/dev/null
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert {"test_accuracy", "test_loss", "samples_per_s", "epochs", "devices"} <= d.keys(), d
' "$tmp/json"
ok $? "--json prints one object with the result keys: $(head -c 200 "$tmp/json")"

# The resnet preset: a few steps of a ResNet-8 train and evaluate, and the
# checkpoint holds its BatchNorm buffers.
"$train" --data "$data" --devices host --model resnet --depth 8 --limit 256 --batch 32 \
    --max-steps 4 --quiet --checkpoint "$tmp/resnet.st" >"$tmp/out" 2>"$tmp/err" &&
    grep -Eq '^result test_accuracy=[0-9.]+ .* devices=host$' "$tmp/out" &&
    grep -q 'layer2.0.downsample.1.running_var' "$tmp/resnet.st" &&
    grep -q 'layer3.0.bn2.num_batches_tracked' "$tmp/resnet.st"
ok $? "--model resnet --depth 8: 4 steps, evaluated, the checkpoint holds the running statistics ($(cat "$tmp/out") $(head -c 200 "$tmp/err"))"

# The resnet's defaults are AdamW, a weight decay of 0.05 and lr 3e-3: the
# same flags given by hand train the same bits, Adam trains other ones.
resnet_quick="--data $data --devices host --model resnet --depth 8 --limit 128 --batch 32 --max-steps 2 --quiet"
"$train" $resnet_quick --checkpoint "$tmp/rn-default.st" >/dev/null 2>&1 &&
    "$train" $resnet_quick --optimizer adamw --weight-decay 0.05 --lr 0.003 \
        --checkpoint "$tmp/rn-given.st" >/dev/null 2>&1 &&
    "$train" $resnet_quick --optimizer adam --checkpoint "$tmp/rn-adam.st" >/dev/null 2>&1 &&
    cmp -s "$tmp/rn-default.st" "$tmp/rn-given.st" && ! cmp -s "$tmp/rn-default.st" "$tmp/rn-adam.st"
ok $? "the resnet's defaults are --optimizer adamw --weight-decay 0.05 --lr 0.003; adam differs"

# Two replicas on one device (how data parallelism runs on a single GPU):
# accepted, said so, and the same training as one replica up to rounding.
"$train" --data "$data" --devices host,host --model mlp --limit 2000 --batch 50 --epochs 2 \
    --split equal --reduce host --log "$tmp/hh.jsonl" >"$tmp/out" 2>"$tmp/err"
status=$?
test "$status" -eq 0 && grep -q 'devices=host,host$' "$tmp/out" &&
    grep -qx 'chorus-train: 2 replicas share host' "$tmp/err"
ok $? "--devices host,host trains and says that 2 replicas share host (status $status: $(cat "$tmp/out") $(head -c 200 "$tmp/err" | tr '\n' ' '))"
python3 -c '
import json, sys
one = [json.loads(l) for l in open(sys.argv[1])]
two = [json.loads(l) for l in open(sys.argv[2])]
assert len(one) == len(two) == 80, (len(one), len(two))
for a, b in zip(one, two):
    d = b["devices"]
    assert [(x["id"], x["share"], x["replicas_on_device"]) for x in d] == [("host", 0.5, 2)] * 2, d
    assert abs(a["loss"] - b["loss"]) <= 1e-4, ("step", a["step"], a["loss"], b["loss"])
' "$tmp/log.jsonl" "$tmp/hh.jsonl"
ok $? "host,host: the log marks both replicas as sharing host, and every step's loss is one replica's +- 1e-4: $(head -n 1 "$tmp/hh.jsonl" | head -c 300)"

# One epoch, save, resume, one more: the same bits as two epochs straight.
# The default cosine schedule spans the planned epochs, so this plain
# "--epochs 1, then --epochs 2" case uses a constant learning rate.
# shellcheck disable=SC2086
"$train" $quick --schedule constant --epochs 2 --checkpoint "$tmp/straight-c.st" >/dev/null 2>&1 &&
    "$train" $quick --schedule constant --epochs 1 --checkpoint "$tmp/one.st" >/dev/null 2>&1 &&
    "$train" $quick --schedule constant --epochs 2 --resume "$tmp/one.st" \
        --checkpoint "$tmp/resumed.st" >/dev/null 2>&1
ok $? "train 2 epochs; train 1 epoch, then resume for the second"
cmp -s "$tmp/straight-c.st" "$tmp/resumed.st"
ok $? "resuming at an epoch boundary gives a checkpoint identical to training straight through"

# Stopped in the middle of an epoch (step 57 of 80), then resumed, with the
# default cosine schedule.
# shellcheck disable=SC2086
"$train" $quick --epochs 2 --max-steps 57 --checkpoint "$tmp/mid.st" >/dev/null 2>&1 &&
    "$train" $quick --epochs 2 --resume "$tmp/mid.st" --checkpoint "$tmp/mid-resumed.st" >/dev/null 2>&1
ok $? "stop at step 57, then resume"
cmp -s "$tmp/straight.st" "$tmp/mid-resumed.st"
ok $? "resuming mid-epoch gives a checkpoint identical to training straight through"

# --checkpoint-every: a run killed (SIGKILL) mid-epoch leaves the last
# periodic checkpoint, whole (written atomically), at a multiple of 7 steps
# that is no epoch's end (40 steps an epoch); resumed, it trains the
# straight run's bits. The cnn's steps are slow enough to kill it soon
# after the first one appears.
every="--data $data --devices host --model cnn --limit 2000 --batch 50 --quiet --epochs 3"
# shellcheck disable=SC2086
"$train" $every --checkpoint "$tmp/every-straight.st" >/dev/null 2>&1
# shellcheck disable=SC2086
"$train" $every --checkpoint-every 7 --checkpoint "$tmp/every.st" >/dev/null 2>&1 &
pid=$!
i=0
while [ ! -f "$tmp/every.st" ] && kill -0 "$pid" 2>/dev/null && [ $i -lt 6000 ]; do
    sleep 0.05
    i=$((i + 1))
done
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
step=$(python3 -c '
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    print(json.loads(f.read(n))["__metadata__"]["step"])
' "$tmp/every.st" 2>/dev/null)
case $step in
'' | *[!0-9]*) false ;;
*) [ $((step % 7)) -eq 0 ] && [ $((step % 40)) -ne 0 ] ;;
esac
ok $? "--checkpoint-every 7, killed mid-run: its checkpoint is whole, at step ${step:-none} (a multiple of 7, mid-epoch)"
# shellcheck disable=SC2086
"$train" $every --checkpoint-every 7 --resume "$tmp/every.st" --checkpoint "$tmp/every-resumed.st" \
    >/dev/null 2>&1 &&
    cmp -s "$tmp/every-straight.st" "$tmp/every-resumed.st"
ok $? "... resumed from it, the run ends with the straight run's checkpoint, byte for byte"
# shellcheck disable=SC2086
"$train" $quick --checkpoint-every 7 >/dev/null 2>"$tmp/every.err"
[ $? -eq 2 ] && grep -q -- "--checkpoint-every needs --checkpoint" "$tmp/every.err"
ok $? "--checkpoint-every without --checkpoint: exit 2, saying so"

# --weight-decay: AdamW's default is 0.01, so giving it changes nothing and
# giving 0 changes the weights.
# shellcheck disable=SC2086
"$train" $quick --epochs 1 --max-steps 5 --optimizer adamw --checkpoint "$tmp/wd-default.st" \
    >/dev/null 2>&1 &&
    "$train" $quick --epochs 1 --max-steps 5 --optimizer adamw --weight-decay 0.01 \
        --checkpoint "$tmp/wd-001.st" >/dev/null 2>&1 &&
    "$train" $quick --epochs 1 --max-steps 5 --optimizer adamw --weight-decay 0 \
        --checkpoint "$tmp/wd-0.st" >/dev/null 2>&1 &&
    cmp -s "$tmp/wd-default.st" "$tmp/wd-001.st" && ! cmp -s "$tmp/wd-default.st" "$tmp/wd-0.st"
ok $? "--weight-decay 0.01 is adamw's default; --weight-decay 0 trains other weights"

# Augmented images: the draws are keyed by (seed, epoch, sample), so a run
# stopped mid-epoch and resumed sees what the straight run saw; and the
# augmentation changes what is learnt.
aug="--augment flip,crop:3"
# shellcheck disable=SC2086
"$train" $quick $aug --epochs 2 --checkpoint "$tmp/aug.st" >/dev/null 2>&1 &&
    "$train" $quick $aug --epochs 2 --max-steps 57 --checkpoint "$tmp/aug-mid.st" >/dev/null 2>&1 &&
    "$train" $quick $aug --epochs 2 --resume "$tmp/aug-mid.st" \
        --checkpoint "$tmp/aug-resumed.st" >/dev/null 2>&1
ok $? "$aug: 2 epochs straight; stop at step 57 and resume"
cmp -s "$tmp/aug.st" "$tmp/aug-resumed.st" && ! cmp -s "$tmp/aug.st" "$tmp/straight.st"
ok $? "$aug: the resumed run's checkpoint equals the straight one's, and differs from an unaugmented run's"

# The inputs' normalisation a checkpoint records: both floats, bit for bit.
recorded() {
    python3 -c '
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
meta = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])["__metadata__"]
f32 = lambda x: struct.unpack("f", struct.pack("f", float(x)))[0]
assert (f32(meta["input_mean"]), f32(meta["input_std"])) == (f32(sys.argv[2]), f32(sys.argv[3])), meta
' "$@"
}
recorded "$tmp/straight.st" 0.2860 0.3530
ok $? "Fashion-MNIST is normalised with 0.2860 and 0.3530, as the checkpoint records"

# A made-up IDX set whose statistics are far from Fashion-MNIST's: both of
# its sets are normalised with its own training images' mean and std, and a
# resume or an evaluation uses what the checkpoint records.
idx="$tmp/idx"
stats=$(python3 "$(dirname "$0")/idxset.py" "$idx" 600 100)
mean=${stats% *}
std=${stats#* }
made="--data $idx --devices host --model mlp --batch 20 --quiet --schedule constant"
# shellcheck disable=SC2086
"$train" $made --epochs 1 --checkpoint "$tmp/own.st" >/dev/null 2>"$tmp/err" &&
    recorded "$tmp/own.st" "$mean" "$std"
ok $? "a made-up set (mean $mean, std $std): the checkpoint records its own statistics ($(head -c 200 "$tmp/err"))"
# shellcheck disable=SC2086
"$train" $made --epochs 1 --normalize "$mean,$std" --checkpoint "$tmp/own-given.st" \
    >/dev/null 2>&1 && cmp -s "$tmp/own.st" "$tmp/own-given.st" &&
    "$train" $made --epochs 1 --normalize 0.2860,0.3530 --checkpoint "$tmp/own-fashion.st" \
        >/dev/null 2>&1 && ! cmp -s "$tmp/own.st" "$tmp/own-fashion.st"
ok $? "it trains as with --normalize $mean,$std, not as with Fashion-MNIST's 0.2860,0.3530"
# shellcheck disable=SC2086
"$train" $made --normalize 0.5,0.25 --epochs 2 --checkpoint "$tmp/n-straight.st" \
    >"$tmp/n-straight.out" 2>/dev/null &&
    "$train" $made --normalize 0.5,0.25 --epochs 1 --checkpoint "$tmp/n-one.st" >/dev/null 2>&1 &&
    "$train" $made --epochs 2 --resume "$tmp/n-one.st" --checkpoint "$tmp/n-resumed.st" \
        >/dev/null 2>&1 && cmp -s "$tmp/n-straight.st" "$tmp/n-resumed.st"
ok $? "--normalize 0.5,0.25, then resumed without it: the checkpoint of training straight through"
# shellcheck disable=SC2086
"$train" $made --epochs 2 --resume "$tmp/n-straight.st" >"$tmp/n-eval.out" 2>/dev/null
test "$(cut -d' ' -f2,3 "$tmp/n-eval.out")" = "$(cut -d' ' -f2,3 "$tmp/n-straight.out")"
ok $? "evaluating that checkpoint gives the result of the run that wrote it: $(cut -d' ' -f2,3 "$tmp/n-eval.out"), want $(cut -d' ' -f2,3 "$tmp/n-straight.out")"
# shellcheck disable=SC2086
"$train" $made --epochs 2 --resume "$tmp/n-one.st" --normalize 0.6,0.25 >/dev/null 2>"$tmp/err"
status=$?
test "$status" -eq 2 && test "$(wc -l <"$tmp/err")" -eq 1 && grep -q -- '--normalize 0.6,0.25' "$tmp/err" &&
    grep -q '0.5,0.25' "$tmp/err"
ok $? "--normalize other than the checkpoint's: exit 2 and one line naming both (got $status: $(cat "$tmp/err"))"

# Data parallel over host and the two PoCL devices: it learns and reports
# every device's share.
if "$train" --devices host,opencl:0,opencl:1 --help >/dev/null 2>&1 &&
    CHORUS_DEVICES=host,opencl:0,opencl:1 "$train" --data "$tmp/nowhere" 2>&1 | grep -q -- '--data'; then
    dp="--data $data --devices host,opencl:0,opencl:1 --model mlp --limit 2000 --batch 40 --quiet"
    # shellcheck disable=SC2086
    "$train" $dp --split 2,1,1 --epochs 2 --checkpoint "$tmp/dp.st" --log "$tmp/dp.jsonl" \
        >"$tmp/out" 2>"$tmp/err"
    status=$?
    acc=$(sed -n 's/^result test_accuracy=\([0-9.]*\) .*/\1/p' "$tmp/out")
    test "$status" -eq 0 && awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.70) }'
    ok $? "data parallel over host,opencl:0,opencl:1 learns: accuracy $acc (status $status $(head -c 200 "$tmp/err"))"
    python3 -c '
import json, sys
d = json.loads(open(sys.argv[1]).readline())["devices"]
assert [x["id"] for x in d] == ["host", "opencl:0", "opencl:1"], d
assert [x["share"] for x in d] == [0.5, 0.25, 0.25], d
' "$tmp/dp.jsonl"
    ok $? "the log gives each device its share of the batch (2:1:1) and time: $(head -n 1 "$tmp/dp.jsonl" | head -c 300)"

    # The defaults: auto reduction, automatic split.
    # shellcheck disable=SC2086
    "$train" $dp --epochs 1 --log "$tmp/auto.jsonl" >"$tmp/out" 2>"$tmp/err"
    status=$?
    acc=$(sed -n 's/^result test_accuracy=\([0-9.]*\) .*/\1/p' "$tmp/out")
    test "$status" -eq 0 && awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.65) }'
    ok $? "auto reduction and automatic split learn: accuracy $acc (status $status $(head -c 200 "$tmp/err"))"
    python3 -c '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
for d in lines:
    shares = [x["share"] for x in d["devices"]]
    assert abs(sum(shares) - 1) < 1e-3 and min(shares) > 0, d
' "$tmp/auto.jsonl"
    ok $? "with --split auto every step gives every device a share, summing to 1: $(tail -n 1 "$tmp/auto.jsonl" | head -c 300)"

    # The timeline and the breakdown: --trace, --bucket-mb auto, the
    # breakdown in --json and on the terminal (stderr, not --quiet).
    # shellcheck disable=SC2086
    "$train" $(echo "$dp" | sed 's/--quiet//') --epochs 1 --bucket-mb auto --trace "$tmp/t.json" \
        --json >"$tmp/tr.json" 2>"$tmp/err"
    status=$?
    test "$status" -eq 0 && python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
b = d["breakdown"]
assert b["calls"] > 0 and b["step_s"] > 0 and b["bucket_mb"] in (1, 4, 16, 64), b
assert [x["id"] for x in b["devices"]] == ["host", "opencl:0", "opencl:1"], b
assert all(x["compute_s"] > 0 for x in b["devices"]), b
assert sum(x["slowest_calls"] for x in b["devices"]) == b["calls"], b
t = json.load(open(sys.argv[2]))["traceEvents"]
names = {e["args"]["name"] for e in t if e["ph"] == "M" and e["name"] == "thread_name"}
assert {"host", "opencl:0", "opencl:1", "reducer", "steps"} <= names, names
' "$tmp/tr.json" "$tmp/t.json" &&
        grep -Eq '^breakdown: [^ ]+ slowest in [0-9]+% of steps; [0-9]+% of the step is reduction not hidden by backward' "$tmp/err" &&
        grep -q -- '--bucket-mb auto chose [0-9]* MiB' "$tmp/err"
    ok $? "--trace, --bucket-mb auto and the breakdown (status $status: $(head -c 300 "$tmp/tr.json") $(grep breakdown "$tmp/err" | head -c 300))"

    # Resuming data-parallel training over host and OpenCL replicas gives the
    # bits of training straight through: the replicas take the same
    # optimizer step bit for bit on both backends.
    fixed="$dp --split equal --reduce host --schedule constant"
    # shellcheck disable=SC2086
    "$train" $fixed --epochs 2 --checkpoint "$tmp/dp-straight.st" >/dev/null 2>&1 &&
        "$train" $fixed --epochs 1 --checkpoint "$tmp/dp-one.st" >/dev/null 2>&1 &&
        "$train" $fixed --epochs 2 --resume "$tmp/dp-one.st" --checkpoint "$tmp/dp-resumed.st" \
            >/dev/null 2>&1 &&
        cmp -s "$tmp/dp-straight.st" "$tmp/dp-resumed.st"
    ok $? "data parallel over host,opencl:0,opencl:1: resuming gives the checkpoint of training straight through"

    # --accumulate 2 over the replicas: 50 batches of 40 make 25 steps an epoch.
    # shellcheck disable=SC2086
    "$train" $dp --accumulate 2 --epochs 1 --json >"$tmp/acc.json" 2>"$tmp/err"
    python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["steps"] == 25 and d["test_accuracy"] >= 0.6, d
' "$tmp/acc.json"
    ok $? "--accumulate 2 takes one step every two batches and learns: $(head -c 200 "$tmp/acc.json")"

    # The default --devices all: PoCL's CPU devices are left out of "all"
    # unless CHORUS_DEVICES names them; then it trains over all three.
    CHORUS_DEVICES=host,opencl:0,opencl:1 "$train" --data "$data" --model mlp --limit 400 \
        --quiet --epochs 1 --log "$tmp/all.jsonl" >"$tmp/out" 2>"$tmp/err"
    status=$?
    test "$status" -eq 0 && grep -q 'devices=host,opencl:0,opencl:1$' "$tmp/out" &&
        head -n 1 "$tmp/all.jsonl" | grep -q '"opencl:1"'
    ok $? "the default --devices all trains over every device CHORUS_DEVICES names (status $status: $(cat "$tmp/out") $(head -c 200 "$tmp/err"))"
    "$train" --data "$data" --model mlp --limit 400 --quiet --epochs 1 >"$tmp/out" 2>"$tmp/err"
    grep -q 'devices=host$' "$tmp/out"
    ok $? "without CHORUS_DEVICES, all leaves PoCL's CPU devices out: $(cat "$tmp/out")"

    "$train" --data "$data" --devices host,opencl:0 --reduce peer --limit 100 >/dev/null 2>"$tmp/err"
    status=$?
    test "$status" -eq 2 && test "$(wc -l <"$tmp/err")" -eq 1 && grep -q -- '--reduce peer' "$tmp/err" &&
        grep -q 'opencl:0' "$tmp/err"
    ok $? "--reduce peer across host and OpenCL: exit 2 and one line naming it (got $status: $(cat "$tmp/err"))"

    # --device-memory over data parallelism: each device's peak and limit
    # in --json; a device --devices does not train on is refused.
    # shellcheck disable=SC2086
    "$train" $dp --epochs 1 --max-steps 3 --json --device-memory opencl:0=1G,host=6G \
        >"$tmp/dpm.json" 2>"$tmp/err"
    status=$?
    test "$status" -eq 0 && python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))["memory"]
assert list(m) == ["host", "opencl:0", "opencl:1"], m
assert [m[d]["limit_bytes"] for d in m] == [6 << 30, 1 << 30, 0], m
assert all(0 < m[d]["peak_bytes"] <= m[d]["peak_reserved_bytes"] for d in m), m
' "$tmp/dpm.json"
    ok $? "--device-memory opencl:0=1G,host=6G over three devices: each one's peak and limit in --json (got $status: $(head -c 300 "$tmp/dpm.json"))"
    "$train" --data "$data" --devices host --device-memory opencl:0=1G >/dev/null 2>"$tmp/err"
    status=$?
    test "$status" -eq 2 && test "$(wc -l <"$tmp/err")" -eq 1 && grep -q 'opencl:0' "$tmp/err"
    ok $? "--device-memory of a device --devices leaves out: exit 2 and one line naming it (got $status: $(cat "$tmp/err"))"
else
    for what in "learns" "shares" "auto learns" "auto shares" "trace" "resume" "accumulate" "all" \
        "all without CHORUS_DEVICES" "peer refused" "device-memory" "device-memory not listed"; do
        skip "no opencl:0 and opencl:1 for data parallel training ($what)"
    done
fi

# --accumulate on one device goes through the data-parallel wrapper: 40
# batches of 50 make 20 steps.
# shellcheck disable=SC2086
"$train" $quick --accumulate 2 --epochs 1 --json >"$tmp/acc1.json" 2>"$tmp/err"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["steps"] == 20 and d["test_accuracy"] >= 0.6, d
' "$tmp/acc1.json"
ok $? "--accumulate 2 on host: 20 steps for 40 batches: $(head -c 200 "$tmp/acc1.json") $(head -c 200 "$tmp/err")"

# Bad input: one line on stderr and exit 2; runtime failures exit 1.
"$train" --epochs zero >/dev/null 2>"$tmp/err"
status=$?
test "$status" -eq 2 && test "$(wc -l <"$tmp/err")" -eq 1 && grep -q -- '--epochs' "$tmp/err"
ok $? "a bad option value: exit 2 and one line naming it (got $status: $(cat "$tmp/err"))"
for bad in "--reduce sideways" "--split 1,x" "--bucket-mb 0" "--accumulate 0" "--split 1,2,3,4" \
    "--normalize 0.5,0" "--normalize 0.5" "--normalize x,1" "--augment sideways" \
    "--augment crop:0" "--augment flip," "--augment flip,flip" "--augment crop:x" \
    "--weight-decay -1" "--weight-decay x"; do
    # shellcheck disable=SC2086
    "$train" --data "$data" --devices host $bad >/dev/null 2>"$tmp/err"
    status=$?
    opt=${bad%% *}
    test "$status" -eq 2 && test "$(wc -l <"$tmp/err")" -eq 1 && grep -q -- "${opt#--}" "$tmp/err"
    ok $? "$bad: exit 2 and one line naming it (got $status: $(cat "$tmp/err"))"
done
for bad in "--bucket-mb x" "--bucket-mb autox" "--trace $tmp/nowhere/t.json"; do
    # shellcheck disable=SC2086
    "$train" --data "$data" --devices host --limit 100 --epochs 1 $bad >/dev/null 2>"$tmp/err"
    status=$?
    opt=${bad%% *}
    test "$status" -eq 2 && test "$(wc -l <"$tmp/err")" -eq 1 && grep -q -- "${opt#--}" "$tmp/err"
    ok $? "$bad: exit 2 and one line naming it (got $status: $(cat "$tmp/err"))"
done
"$train" --devices cuda:99 --data "$data" >/dev/null 2>"$tmp/err"
status=$?
test "$status" -eq 2 && test "$(wc -l <"$tmp/err")" -eq 1 && grep -q 'cuda:99' "$tmp/err"
ok $? "an unknown device: exit 2 and one line naming it (got $status: $(cat "$tmp/err"))"
"$train" --data "$tmp/nowhere" --devices host >/dev/null 2>"$tmp/err"
status=$?
test "$status" -eq 2 && test "$(wc -l <"$tmp/err")" -eq 1 && grep -q "$tmp/nowhere" "$tmp/err"
ok $? "missing data: exit 2 and one line naming the folder (got $status: $(cat "$tmp/err"))"
cp "$tmp/one.st" "$tmp/keep.st"
# shellcheck disable=SC2086
"$train" $quick --epochs 1 --checkpoint "$tmp/no/such/dir/x.st" >/dev/null 2>"$tmp/err"
status=$?
test "$status" -eq 1 && grep -q 'checkpoint' "$tmp/err"
ok $? "an unwritable checkpoint: exit 1 with a message (got $status: $(tr '\n' ' ' <"$tmp/err"))"
printf 'garbage' >"$tmp/bad.st"
# shellcheck disable=SC2086
"$train" $quick --epochs 1 --resume "$tmp/bad.st" --checkpoint "$tmp/keep.st" >/dev/null 2>"$tmp/err"
status=$?
test "$status" -eq 1 && cmp -s "$tmp/one.st" "$tmp/keep.st"
ok $? "a corrupt --resume file: exit 1, the existing checkpoint untouched (got $status)"

# A --devices list longer than chorus-train keeps: exit 2, saying so.
long=$(printf 'host,%.0s' $(seq 250))host
# shellcheck disable=SC2086
"$train" $quick --epochs 1 --devices "$long" >/dev/null 2>"$tmp/err"
status=$?
test "$status" -eq 2 && grep -q -- '--devices: a list is longer than 1023 characters' "$tmp/err"
ok $? "a --devices list of ${#long} characters: exit 2 naming the limit (got $status: $(cat "$tmp/err"))"

# --save-dtype bf16: every float tensor BF16 (the counters I64), the file
# about half the size, and a run resumes from it.
# shellcheck disable=SC2086
"$train" $quick --epochs 1 --save-dtype bf16 --checkpoint "$tmp/bf16.st" >/dev/null 2>&1 &&
    python3 -c '
import json, struct, sys, os
half, full = sys.argv[1], sys.argv[2]
with open(half, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
kinds = {v["dtype"] for k, v in h.items() if k != "__metadata__"}
assert kinds <= {"BF16", "I64"} and "BF16" in kinds, kinds
assert os.path.getsize(half) < 0.55 * os.path.getsize(full), (os.path.getsize(half), os.path.getsize(full))
' "$tmp/bf16.st" "$tmp/one.st"
ok $? "--save-dtype bf16: every float tensor BF16, under 0.55 of the f32 file's size"
# shellcheck disable=SC2086
"$train" $quick --epochs 2 --resume "$tmp/bf16.st" >"$tmp/bf16.out" 2>&1
status=$?
grep -Eq '^result test_accuracy=0\.[0-9]+ ' "$tmp/bf16.out"
ok $((status + $?)) "a run resumes from the bf16 checkpoint (got $status: $(tail -1 "$tmp/bf16.out"))"
# shellcheck disable=SC2086
"$train" $quick --epochs 1 --save-dtype f64 >/dev/null 2>"$tmp/err"
status=$?
test "$status" -eq 2 && grep -q -- '--save-dtype is f32, bf16 or f16' "$tmp/err"
ok $? "--save-dtype f64: exit 2 naming the choices (got $status: $(cat "$tmp/err"))"

# --precision bf16: the layers' GEMMs on bf16-rounded inputs (f32 master
# weights); it learns as f32 does, and says so on its result line.
# shellcheck disable=SC2086
"$train" $quick --epochs 2 --precision bf16 --checkpoint "$tmp/p-bf16.st" >"$tmp/p-bf16.out" 2>&1
status=$?
acc=$(sed -n 's/^result test_accuracy=\([0-9.]*\) .*/\1/p' "$tmp/p-bf16.out")
awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.70) }' &&
    grep -Eq ' precision=bf16$' "$tmp/p-bf16.out" && ! cmp -s "$tmp/p-bf16.st" "$tmp/straight.st"
ok $((status + $?)) "--precision bf16 learns (accuracy $acc >= 0.70), says so, other bits than f32 (got $status: $(tail -1 "$tmp/p-bf16.out"))"
# --precision fp16: the loss scale and its clean steps go into the
# checkpoint, so a run stopped at step 57 and resumed ends with the
# straight run's file, metadata included.
# shellcheck disable=SC2086
"$train" $quick --epochs 2 --precision fp16 --checkpoint "$tmp/p-f16.st" >"$tmp/p-f16.out" 2>&1 &&
    "$train" $quick --epochs 2 --max-steps 57 --precision fp16 --checkpoint "$tmp/p-f16-mid.st" \
        >/dev/null 2>&1 &&
    python3 -c '
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    m = json.loads(f.read(n))["__metadata__"]
assert float(m["loss_scale"]) == 65536.0 and m["loss_scale_clean"] == "57", m
' "$tmp/p-f16-mid.st" &&
    "$train" $quick --epochs 2 --precision fp16 --resume "$tmp/p-f16-mid.st" \
        --checkpoint "$tmp/p-f16-resumed.st" >/dev/null 2>&1 &&
    cmp -s "$tmp/p-f16.st" "$tmp/p-f16-resumed.st" && grep -Eq ' precision=fp16 loss_scale=65536 skipped_steps=0$' "$tmp/p-f16.out"
ok $? "--precision fp16: the checkpoint at step 57 records scale 65536 after 57 clean steps, and resuming from it gives the straight run's file ($(tail -1 "$tmp/p-f16.out"))"
# --reduce-dtype bf16 over two host replicas: it learns.
# shellcheck disable=SC2086
"$train" --data "$data" --devices host,host --model mlp --limit 2000 --batch 50 --quiet \
    --epochs 2 --reduce-dtype bf16 >"$tmp/rd.out" 2>&1
status=$?
acc=$(sed -n 's/^result test_accuracy=\([0-9.]*\) .*/\1/p' "$tmp/rd.out")
awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.70) }'
ok $((status + $?)) "--reduce-dtype bf16 over host,host learns (accuracy $acc >= 0.70; got $status)"
# shellcheck disable=SC2086
"$train" $quick --epochs 1 --reduce-dtype f16 >/dev/null 2>"$tmp/err"
status=$?
test "$status" -eq 2 && grep -q -- '--reduce-dtype is f32 or bf16' "$tmp/err"
ok $? "--reduce-dtype f16: exit 2 naming the choices (got $status: $(cat "$tmp/err"))"
# SIGINT and SIGTERM while training: the run stops after the step it is
# in, writes its checkpoint at that step (the log's last line), exits 130
# or 143, and the checkpoint resumes.
for sig in INT TERM; do
    rm -f "$tmp/sig.st" "$tmp/sig.jsonl"
    # shellcheck disable=SC2086
    "$train" $quick --epochs 50 --checkpoint "$tmp/sig.st" --log "$tmp/sig.jsonl" \
        >"$tmp/sig.out" 2>"$tmp/sig.err" &
    pid=$!
    tries=0
    while [ "$(wc -l <"$tmp/sig.jsonl" 2>/dev/null || echo 0)" -lt 5 ] && [ $tries -lt 600 ]; do
        sleep 0.1
        tries=$((tries + 1))
    done
    kill -s "$sig" "$pid"
    wait "$pid"
    status=$?
    want=$([ "$sig" = INT ] && echo 130 || echo 143)
    steps=$(wc -l <"$tmp/sig.jsonl")
    python3 -c '
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    m = json.loads(f.read(n))["__metadata__"]
assert int(m["step"]) == int(sys.argv[2]), (m["step"], sys.argv[2])
' "$tmp/sig.st" "$steps" && grep -q "SIG$sig: stopped after step $steps" "$tmp/sig.err"
    ok $((status != want || $? != 0)) "SIG$sig after $steps steps: exit $status (want $want), the checkpoint at step $steps, the message says so ($(head -c 200 "$tmp/sig.err"))"
done
# shellcheck disable=SC2086
"$train" $quick --epochs 2 --resume "$tmp/sig.st" >"$tmp/sig-resumed.out" 2>&1
grep -Eq '^result test_accuracy=0\.[0-9]+ ' "$tmp/sig-resumed.out"
ok $? "the checkpoint a signal left resumes ($(tail -1 "$tmp/sig-resumed.out"))"
# shellcheck disable=SC2086
"$train" $quick --epochs 1 --precision fp64 >/dev/null 2>"$tmp/err"
status=$?
test "$status" -eq 2 && grep -q -- '--precision is f32, bf16 or fp16' "$tmp/err"
ok $? "--precision fp64: exit 2 naming the choices (got $status: $(cat "$tmp/err"))"

# Memory: each device's peak over training in --json and on stderr; a
# limit below that peak fails training with the allocator's message
# (exit 1); one above it trains and is reported.
peak_of() { # FILE DEVICE KEY
    python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))["memory"][sys.argv[2]]
assert 0 < m["peak_bytes"] <= m["peak_reserved_bytes"], m
print(m[sys.argv[3]])
' "$@"
}
# shellcheck disable=SC2086
"$train" $(echo "$quick" | sed 's/--quiet//') --epochs 1 --max-steps 5 --json >"$tmp/mem.json" \
    2>"$tmp/err"
status=$?
peak=$(peak_of "$tmp/mem.json" host peak_bytes)
test "$status" -eq 0 && test "$(peak_of "$tmp/mem.json" host limit_bytes)" -eq 0 &&
    grep -Eq '^memory: host peak [0-9.]+ MiB$' "$tmp/err"
ok $? "--json gives host's peak over training ($peak bytes) and no limit; stderr says it: $(grep '^memory' "$tmp/err")"
# A byte below that peak: the host's share goes in micro-batches sized to
# fit (measured in the first step), under the limit, and the log says so.
# shellcheck disable=SC2086
"$train" $quick --epochs 1 --max-steps 5 --device-memory "host=$((peak - 1))" --json \
    --log "$tmp/memlim.log" >"$tmp/memlim.json" 2>"$tmp/err"
status=$?
test "$status" -eq 0 && python3 -c '
import json, sys
limit = int(sys.argv[3])
m = json.load(open(sys.argv[1]))["memory"]["host"]
assert m["limit_bytes"] == limit and m["peak_reserved_bytes"] <= limit, m
last = [json.loads(l) for l in open(sys.argv[2])][-1]["devices"][0]
assert 1 <= last["micro_batch"] < 50 and last["micro_batches"] >= 2, last
' "$tmp/memlim.json" "$tmp/memlim.log" $((peak - 1))
ok $? "--device-memory host=$((peak - 1)), a byte below that peak: it trains in micro-batches under the limit (got $status: $(tail -1 "$tmp/memlim.log" | head -c 400) $(tr '\n' ' ' <"$tmp/err"))"
# Less than the model itself needs: training fails naming the device, the
# request and the limit.
# shellcheck disable=SC2086
"$train" $quick --epochs 1 --max-steps 5 --device-memory "host=1M" >/dev/null 2>"$tmp/err"
status=$?
test "$status" -eq 1 &&
    grep -Eq '(training failed|cannot set up training): .*host: [0-9.]+ (bytes|KiB|MiB) requested with [0-9.]+ (bytes|KiB|MiB) of its [0-9.]+ MiB limit in use \(ch_device_set_memory_limit\)' "$tmp/err"
ok $? "--device-memory host=1M, less than the model needs: training fails naming the device, the request and the limit (got $status: $(tr '\n' ' ' <"$tmp/err"))"
# shellcheck disable=SC2086
"$train" $(echo "$quick" | sed 's/--quiet//') --epochs 1 --max-steps 5 --json \
    --device-memory "host=$((2 * peak))" >"$tmp/mem2.json" 2>"$tmp/err"
status=$?
test "$status" -eq 0 && test "$(peak_of "$tmp/mem2.json" host limit_bytes)" -eq $((2 * peak)) &&
    test "$(peak_of "$tmp/mem2.json" host peak_bytes)" -le $((2 * peak)) &&
    grep -Eq '^memory: host peak [0-9.]+ MiB of its [0-9.]+ MiB limit$' "$tmp/err"
ok $? "--device-memory host=$((2 * peak)): it trains and reports the limit (got $status: $(grep '^memory' "$tmp/err") $(head -c 300 "$tmp/mem2.json"))"
for bad in "host" "host=" "=1G" "host=0" "host=-1G" "host=1X" "host=0x10" "host=1G,host=2G" \
    "host=1G," "host=99999999T"; do
    # shellcheck disable=SC2086
    "$train" $quick --epochs 1 --device-memory "$bad" >/dev/null 2>"$tmp/err"
    status=$?
    test "$status" -eq 2 && test "$(wc -l <"$tmp/err")" -eq 1 && grep -q -- '--device-memory' "$tmp/err"
    ok $? "--device-memory $bad: exit 2 and one line naming it (got $status: $(cat "$tmp/err"))"
done
# shellcheck disable=SC2086
"$train" $quick --epochs 1 --device-memory cuda:99=1G >/dev/null 2>"$tmp/err"
status=$?
test "$status" -eq 2 && test "$(wc -l <"$tmp/err")" -eq 1 && grep -q 'device-memory.*cuda:99' "$tmp/err"
ok $? "--device-memory of an unknown device: exit 2 and one line naming it (got $status: $(cat "$tmp/err"))"
# --shard-optimizer and --recompute go to ch_dp's options.
# shellcheck disable=SC2086
"$train" $quick --epochs 1 --max-steps 3 --shard-optimizer --recompute >"$tmp/out" 2>"$tmp/err"
status=$?
test "$status" -eq 0 && grep -q '^result test_accuracy=' "$tmp/out"
ok $? "--shard-optimizer --recompute train (got $status: $(head -c 200 "$tmp/err"))"
# --tf32 changes CUDA's f32 GEMMs alone: elsewhere the same results.
# shellcheck disable=SC2086
"$train" $quick --epochs 1 --max-steps 3 >"$tmp/plain" 2>"$tmp/err" &&
    "$train" $quick --epochs 1 --max-steps 3 --tf32 >"$tmp/tf32" 2>>"$tmp/err"
status=$?
# The result line without its rates: test_accuracy= and test_loss=.
accuracy_loss() { grep '^result ' "$1" | cut -d' ' -f2,3; }
test "$status" -eq 0 && grep -q '^result test_accuracy=' "$tmp/tf32" &&
    test "$(accuracy_loss "$tmp/plain")" = "$(accuracy_loss "$tmp/tf32")"
ok $? "--tf32 trains, with the losses and accuracy of a run without it on the host (got $status: $(head -c 200 "$tmp/err"))"

tap_done
