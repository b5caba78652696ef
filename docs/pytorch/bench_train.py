#!/usr/bin/env python3
"""PyTorch's twin of bench/bench-train: training samples/s on the CPU.

    python3 bench_train.py [--model mlp|cnn] [--batch 64] [--steps 20]
                           [--threads 2] [--json]
    python3 bench_train.py --compare _build/bench/bench-train [--rounds 7] ...

The step is bench-train's: the preset models of ch_nn_preset, cross-entropy,
Adam (lr 1e-3), random normal images and labels i % 10 already in memory,
zero_grad + forward + loss + backward + optimizer step; 3 warm-up steps,
then the median of --steps timed steps, reported as batch / median.

--compare runs our bench-train (on the host) and this script in turn, each
in a fresh process with the same thread count, --rounds times (PyTorch
first in every other round), and prints
for each model the median of the per-round medians, their spread and the
speed ratio ours / PyTorch's. Interleaving matters on a shared machine:
absolute rates drift by 2x within minutes, the ratio within a round much
less.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def train_rate(kind, batch, steps):
    import torch
    torch.manual_seed(1)
    from models import preset
    model = preset(kind)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(batch, 1, 28, 28)
    labels = torch.arange(batch) % 10
    times = []
    for s in range(-3, steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x), labels)
        loss.backward()
        opt.step()
        if s >= 0:
            times.append(time.perf_counter() - t0)
    return batch / statistics.median(times)


def measure(args):
    import torch
    torch.set_num_threads(args.threads)
    rows = [{"device": "cpu", "model": m, "batch": args.batch,
             "samples_per_s": round(train_rate(m, args.batch, args.steps), 1),
             "threads": torch.get_num_threads(), "torch": torch.__version__}
            for m in args.models]
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'device':<10} {'model':<5} {'batch':>6} {'samples/s':>14}  (PyTorch "
          f"{torch.__version__}, {torch.get_num_threads()} threads)")
    for r in rows:
        print(f"{r['device']:<10} {r['model']:<5} {r['batch']:>6} {r['samples_per_s']:>14.1f}")


def run_json(cmd, env):
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def compare(args):
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    common = ["--batch", str(args.batch), "--steps", str(args.steps)]
    ours_cmd = [args.compare, "--devices", "host", "--json"] + common
    theirs_cmd = [sys.executable, os.path.abspath(__file__), "--json",
                  "--threads", str(args.threads)] + common
    if len(args.models) == 1:
        ours_cmd += ["--model", args.models[0]]
        theirs_cmd += ["--model", args.models[0]]
    rate = {(side, m): [] for side in ("ours", "torch") for m in args.models}
    share = {m: [] for m in args.models}
    for r in range(args.rounds):
        # ABBA: every other round PyTorch goes first, so that a drift of
        # the machine during a round favours neither side.
        for side in ("ours", "torch") if r % 2 == 0 else ("torch", "ours"):
            for row in run_json(ours_cmd if side == "ours" else theirs_cmd, env):
                rate[(side, row["model"])].append(row["samples_per_s"])
                if "gemm_share" in row:
                    share[row["model"]].append(row["gemm_share"])
        line = ", ".join(f"{m} {rate[('ours', m)][-1]:.0f} / {rate[('torch', m)][-1]:.0f}"
                         for m in args.models)
        print(f"round {r + 1}/{args.rounds}: ours / PyTorch samples/s: {line}", flush=True)
    print(f"\n{args.threads} threads, batch {args.batch}, median of {args.steps} steps per "
          f"run, {args.rounds} rounds (median [min, max] over rounds)")
    print(f"{'model':<5} {'ours':>24} {'PyTorch':>24} {'ours/PyTorch':>24} {'GEMM share':>20}")
    for m in args.models:
        ours, torch_ = rate[("ours", m)], rate[("torch", m)]
        ratio = [a / b for a, b in zip(ours, torch_)]

        def cell(v, fmt):
            return (f"{statistics.median(v):{fmt}} [{min(v):{fmt}}, {max(v):{fmt}}]"
                    if v else "-")
        print(f"{m:<5} {cell(ours, '.0f'):>24} {cell(torch_, '.0f'):>24} "
              f"{cell(ratio, '.2f'):>24} {cell(share[m], '.2f'):>20}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["mlp", "cnn"], help="one model (default: both)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", action="store_true")
    p.add_argument("--compare", metavar="BENCH_TRAIN",
                   help="our bench-train program: run it and PyTorch in turn")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    if args.batch < 1 or args.steps < 1 or args.threads < 1 or args.rounds < 1:
        p.error("--batch, --steps, --threads and --rounds must be >= 1")
    args.models = [args.model] if args.model else ["mlp", "cnn"]
    if args.compare:
        compare(args)
    else:
        measure(args)


if __name__ == "__main__":
    main()
