#!/usr/bin/env python3
"""PyTorch's twin of bench/bench-train: training samples/s (the gpt: tokens/s) on the CPU.

    python3 bench_train.py [--model mlp|cnn|resnet|gpt] [--batch 64] [--steps 20]
                           [--threads 2] [--json] [--depth 20]
                           [--layers 4 --heads 4 --dim 128 --context 64 --vocab 256]
    python3 bench_train.py --compare _build/bench/bench-train [--rounds 7] ...
                           [--precision f32|bf16] [--attention math|sdpa]

The step is bench-train's: the preset models of ch_nn_preset, cross-entropy,
Adam (lr 1e-3), data already in memory, zero_grad + forward + loss +
backward + optimizer step; 3 warm-up steps, then the median of --steps
timed steps, reported as batch / median. The image models (mlp, cnn,
resnet of --depth, 16 channels wide) take random normal 1x28x28 images and
labels i % 10; the gpt (dropout 0) takes --batch windows of --context
random tokens and random targets, and reports tokens/s too
(batch * context / median). Without --model: mlp and cnn.

--precision bf16: mixed precision, ours `bench-train --precision bf16`,
PyTorch's forward and loss under torch.autocast("cpu", torch.bfloat16).
--attention (the gpt, PyTorch's side): math writes attention out op by
op as Chorus's fixtures do (models.py), sdpa calls PyTorch's fused
scaled_dot_product_attention (is_causal), as nanoGPT does.

--compare runs our bench-train (on the host) and this script in turn, each
in a fresh process with the same thread count, --rounds times (PyTorch
first in every other round), and prints
for each model the median of the per-round medians, their spread and the
speed ratio ours / PyTorch's, and each side's peak resident memory (the
process's ru_maxrss read by itself after its training, before bench-train
times the GEMMs alone: the whole process, libraries included, measured
the same way on both sides). Interleaving matters on a
shared machine: absolute rates drift by 2x within minutes, the ratio
within a round much less.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def model_config(kind, args):
    if kind == "resnet":
        return {"depth": args.depth}
    if kind == "gpt":
        return {"layers": args.layers, "heads": args.heads, "dim": args.dim,
                "context": args.context, "vocab": args.vocab}
    return {}


def torch_config(kind, args):
    """model_config and what only PyTorch's side takes."""
    config = model_config(kind, args)
    if kind == "gpt":
        config["sdpa"] = args.attention == "sdpa"
    return config


def model_data(kind, batch, args):
    """The model, its inputs and its targets, flattened as the loss takes them."""
    import torch
    torch.manual_seed(1)
    from models import preset
    model = preset(kind, **torch_config(kind, args))
    if kind == "gpt":
        x = torch.randint(0, args.vocab, (batch, args.context))
        labels = torch.randint(0, args.vocab, (batch * args.context,))
        return model, x, labels, lambda y: y.reshape(-1, args.vocab)
    x = torch.randn(batch, 1, 28, 28)
    return model, x, torch.arange(batch) % 10, lambda y: y


def train_rate(kind, batch, steps, args):
    import torch
    model, x, labels, flat = model_data(kind, batch, args)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    half = args.precision == "bf16"
    for s in range(-3, steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=half):
            loss = loss_fn(flat(model(x)), labels)
        loss.backward()
        opt.step()
        if s >= 0:
            times.append(time.perf_counter() - t0)
    return batch / statistics.median(times)


def measure_row(kind, args):
    import torch
    rate = train_rate(kind, args.batch, args.steps, args)
    row = {"device": "cpu", "model": kind, "batch": args.batch, "samples_per_s": round(rate, 1)}
    if kind == "gpt":
        # From the unrounded rate: at a small batch, samples/s to 0.1 times
        # the context moves tokens/s in steps of several percent.
        row["tokens_per_s"] = round(rate * args.context, 1)
        row["attention"] = args.attention
    if args.precision != "f32":
        row["precision"] = args.precision
    # The process's peak resident memory after the training (Linux: KiB),
    # as bench-train reads its own.
    row["max_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)
    row.update(threads=torch.get_num_threads(), torch=torch.__version__)
    return row


def rate_of(row):
    """What a model's speed is measured in: tokens/s for the gpt, else samples/s."""
    return row["tokens_per_s"] if row["model"] == "gpt" else row["samples_per_s"]


def measure(args):
    import torch
    torch.set_num_threads(args.threads)
    rows = [measure_row(m, args) for m in args.models]
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'device':<10} {'model':<6} {'batch':>6} {'samples/s':>14} {'tokens/s':>14}  "
          f"(PyTorch {torch.__version__}, {torch.get_num_threads()} threads)")
    for r in rows:
        tokens = f"{r['tokens_per_s']:>14.1f}" if "tokens_per_s" in r else f"{'-':>14}"
        print(f"{r['device']:<10} {r['model']:<6} {r['batch']:>6} {r['samples_per_s']:>14.1f} "
              f"{tokens}")


def run_json(cmd, env):
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def model_options(kind, args):
    """The command-line options of a model's configuration, the same for
    bench-train and this script."""
    return [w for k, v in model_config(kind, args).items() for w in ("--" + k, str(v))]


def compare(args):
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    common = ["--batch", str(args.batch), "--steps", str(args.steps),
              "--precision", args.precision]
    ours_cmd = [args.compare, "--devices", "host", "--json"] + common
    theirs_cmd = [sys.executable, os.path.abspath(__file__), "--json",
                  "--threads", str(args.threads), "--attention", args.attention] + common
    if len(args.models) == 1:
        extra = ["--model", args.models[0]] + model_options(args.models[0], args)
        ours_cmd += extra
        theirs_cmd += extra
    rate = {(side, m): [] for side in ("ours", "torch") for m in args.models}
    rss = {"ours": [], "torch": []}
    share = {m: [] for m in args.models}
    for r in range(args.rounds):
        # ABBA: every other round PyTorch goes first, so that a drift of
        # the machine during a round favours neither side.
        for side in ("ours", "torch") if r % 2 == 0 else ("torch", "ours"):
            rows = run_json(ours_cmd if side == "ours" else theirs_cmd, env)
            # The peak each side read after its training (before bench-train
            # times the GEMMs alone on operands of their own).
            rss[side].append(max((row.get("max_rss_mib", 0) for row in rows), default=0))
            for row in rows:
                if row["model"] not in args.models:
                    continue
                rate[(side, row["model"])].append(rate_of(row))
                if "gemm_share" in row:
                    share[row["model"]].append(row["gemm_share"])
            missing = [m for m in args.models if len(rate[(side, m)]) <= r]
            if missing:
                sys.exit(f"bench_train: {side} gave no rate for {', '.join(missing)}")
        line = ", ".join(f"{m} {rate[('ours', m)][-1]:.0f} / {rate[('torch', m)][-1]:.0f}"
                         for m in args.models)
        print(f"round {r + 1}/{args.rounds}: ours / PyTorch {unit(args.models)}: {line}; "
              f"peak RSS {rss['ours'][-1]:.0f} / {rss['torch'][-1]:.0f} MiB", flush=True)
    attention = f", PyTorch's attention {args.attention}" if "gpt" in args.models else ""
    print(f"\n{args.threads} threads, batch {args.batch}, {args.precision}{attention}, median "
          f"of {args.steps} steps per run, {args.rounds} rounds (median [min, max] over rounds)")
    print(f"peak RSS of a run (MiB): ours {statistics.median(rss['ours']):.0f} "
          f"[{min(rss['ours']):.0f}, {max(rss['ours']):.0f}], PyTorch "
          f"{statistics.median(rss['torch']):.0f} [{min(rss['torch']):.0f}, "
          f"{max(rss['torch']):.0f}]")
    print(f"{'model':<6} {'ours':>24} {'PyTorch':>24} {'ours/PyTorch':>24} {'GEMM share':>20}")
    for m in args.models:
        ours, torch_ = rate[("ours", m)], rate[("torch", m)]
        ratio = [a / b for a, b in zip(ours, torch_)]

        def cell(v, fmt):
            return (f"{statistics.median(v):{fmt}} [{min(v):{fmt}}, {max(v):{fmt}}]"
                    if v else "-")
        print(f"{m:<6} {cell(ours, '.0f'):>24} {cell(torch_, '.0f'):>24} "
              f"{cell(ratio, '.2f'):>24} {cell(share[m], '.2f'):>20}")


def unit(models):
    return "tokens/s" if models == ["gpt"] else (
        "samples/s" if "gpt" not in models else "samples/s (gpt: tokens/s)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["mlp", "cnn", "resnet", "gpt"],
                   help="one model (default: mlp and cnn)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", action="store_true")
    p.add_argument("--compare", metavar="BENCH_TRAIN",
                   help="our bench-train program: run it and PyTorch in turn")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--depth", type=int, default=20, help="resnet: 6n+2 layers")
    p.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                   help="bf16: autocast (PyTorch), --precision bf16 (ours)")
    p.add_argument("--attention", choices=["math", "sdpa"], default="math",
                   help="the gpt's attention on PyTorch's side: op by op, or "
                   "scaled_dot_product_attention")
    for name, default in (("layers", 4), ("heads", 4), ("dim", 128), ("context", 64),
                          ("vocab", 256)):
        p.add_argument("--" + name, type=int, default=default, help="gpt")
    args = p.parse_args()
    sizes = (args.batch, args.steps, args.threads, args.rounds, args.layers, args.heads,
             args.dim, args.context, args.vocab)
    if min(sizes) < 1:
        p.error("--batch, --steps, --threads, --rounds and the gpt's sizes must be >= 1")
    if args.depth < 8 or (args.depth - 2) % 6:
        p.error("--depth must be 6n+2 with n >= 1 (8, 14, 20, ...)")
    if args.dim % args.heads:
        p.error("--dim must be a multiple of --heads")
    args.models = [args.model] if args.model else ["mlp", "cnn"]
    if args.compare:
        compare(args)
    else:
        measure(args)


if __name__ == "__main__":
    main()
