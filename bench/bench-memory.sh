#!/bin/sh
# Memory per device with and without the sharded optimizer and recomputed
# activations, and what each costs in time: chorus-train's GPT at GPT-2
# small's shape (12 layers, 12 heads, width 768, context 256, byte
# vocabulary) over DEVICES (default host,opencl:0,opencl:1), batch BATCH
# (default 3), STEPS steps (default 3) of AdamW, in four setups
# (neither, --shard-optimizer, --recompute, both), interleaved over ROUNDS
# rounds (default 1); the time is the median step after each run's first.
# Then the proof: a limit on LIMITED (default
# opencl:1) of LIMIT (default: the peak the plain run took there, minus a
# quarter) that the plain run exceeds: without the options it must fail
# with the limit's message, with both it must train PROOF_STEPS (default
# 20) steps with the unlimited run's losses (SKIP_PROOF=1: not).
#
# The text is LINES_OF_TEXT lines (default 800: its last tenth, the
# validation that ends each run, is 6 windows of 256 tokens).
#
# LAUNCH (default none) goes before each chorus-train, as in
# LAUNCH="mpirun -np 2" DEVICES=host SKIP_PROOF=1: every process trains
# DEVICES, the sharded optimizer's parts are every process's replicas',
# and the peaks are rank 0's.
#
# From the build folder:
#     CHORUS_BACKEND_PATH=$PWD/backends/opencl/.libs POCL_DEVICES="pthread pthread" \
#         ../bench/bench-memory.sh
# Prints a table (one row per setup: each device's peak MiB, seconds per
# step) and the proof's lines; OUT (a folder) keeps the JSON and logs.
set -u
train=${CHORUS_TRAIN:-./utils/chorus-train}
launch=${LAUNCH:-}
devices=${DEVICES:-host,opencl:0,opencl:1}
batch=${BATCH:-3} steps=${STEPS:-3} rounds=${ROUNDS:-1} skip_proof=${SKIP_PROOF:-0}
limited=${LIMITED:-opencl:1} proof_steps=${PROOF_STEPS:-20}
[ -x "$train" ] || { echo "bench-memory.sh: no $train (run it from a build folder)" >&2; exit 2; }
out=${OUT:-${TMPDIR:-/tmp}/bench-memory.$$}
mkdir -p "$out" || exit 1

python3 -c '
import sys
words = "the quick brown fox jumps over a lazy dog while seven wise owls sing".split()
sys.stdout.write("".join(" ".join(words[(i * 5 + k) % len(words)] for k in range(4)) + ".\n"
                         for i in range(int(sys.argv[1]))))
' "${LINES_OF_TEXT:-800}" >"$out/text.txt"

gpt2="--model gpt --data $out/text.txt --layers 12 --heads 12 --dim 768 --context 256"
gpt2="$gpt2 --optimizer adamw --lr 3e-4 --schedule constant --batch $batch --split equal"
gpt2="$gpt2 --devices $devices --quiet --eval-every 1000000"

# One run: name, then chorus-train's extra options; its JSON in $out/$name.json.
one() {
    name=$1
    shift
    # shellcheck disable=SC2086 # the options and the launcher are words
    if ! $launch "$train" $gpt2 --json "$@" >"$out/$name.json" 2>"$out/$name.err"; then
        echo "bench-memory.sh: $name failed:" >&2
        tail -5 "$out/$name.err" >&2
        return 1
    fi
}

r=1
while [ "$r" -le "$rounds" ]; do
    one "plain.$r" --max-steps "$steps" --log "$out/plain.$r.log" || exit 1
    one "shard.$r" --max-steps "$steps" --shard-optimizer --log "$out/shard.$r.log" || exit 1
    one "recompute.$r" --max-steps "$steps" --recompute --log "$out/recompute.$r.log" || exit 1
    one "both.$r" --max-steps "$steps" --shard-optimizer --recompute --log "$out/both.$r.log" ||
        exit 1
    r=$((r + 1))
done

python3 - "$out" "$rounds" "$devices" <<'EOF'
import json, statistics, sys
out, rounds, devices = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
print("setup       " + "".join(f"{d + ' MiB':>14}" for d in devices) + "   s/step")
for name in ("plain", "shard", "recompute", "both"):
    runs = [json.load(open(f"{out}/{name}.{r}.json")) for r in range(1, rounds + 1)]
    peaks = [max(run["memory"][d]["peak_bytes"] for run in runs) / 2**20 for d in devices]
    # The steps after the first (which makes the optimizer's state, and
    # compiles kernels on a fresh cache): their median over the rounds.
    secs = statistics.median(json.loads(line)["step_s"] for r in range(1, rounds + 1)
                             for line in list(open(f"{out}/{name}.{r}.log"))[1:])
    print(f"{name:12s}" + "".join(f"{p:14.1f}" for p in peaks) + f"{secs:9.2f}")
EOF

[ "$skip_proof" = 1 ] && exit 0
# The proof: a limit the plain run exceeded on $limited.
peak=$(python3 -c '
import json, sys
print(int(json.load(open(sys.argv[1]))["memory"][sys.argv[2]]["peak_bytes"]))
' "$out/plain.1.json" "$limited")
limit=${LIMIT:-$((peak - peak / 4))}
echo "proof: $limited limited to $limit bytes (the plain run's peak there: $peak)"
one unlimited --max-steps "$proof_steps" --log "$out/unlimited.log" || exit 1
if one refused --max-steps "$proof_steps" --device-memory "$limited=$limit"; then
    echo "proof: FAILED: the plain run trained within the limit" >&2
    exit 1
fi
grep -m1 'limit' "$out/refused.err"
one limited --max-steps "$proof_steps" --device-memory "$limited=$limit" \
    --shard-optimizer --recompute --log "$out/limited.log" || exit 1
python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
a = [json.loads(l)["loss"] for l in open(f"{out}/unlimited.log")]
b = [json.loads(l)["loss"] for l in open(f"{out}/limited.log")]
worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
print(f"proof: {len(b)} steps within the limit; losses {b[0]:.4f} .. {b[-1]:.4f}, "
      f"largest relative difference from the unlimited run's {worst:.2g}")
sys.exit(0 if len(a) == len(b) and worst < 1e-4 else 1)
EOF
