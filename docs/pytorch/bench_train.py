#!/usr/bin/env python3
"""PyTorch's twin of bench/bench-train: training samples/s (the gpt: tokens/s) on the CPU or a GPU.

    python3 bench_train.py [--model mlp|cnn|resnet|gpt] [--batch 64] [--steps 20]
                           [--threads 2] [--json] [--depth 20] [--device cpu|cuda:N]
                           [--layers 4 --heads 4 --dim 128 --context 64 --vocab 256]
                           [--precision f32|bf16] [--tf32] [--optimizer adam|adamw]
                           [--attention math|sdpa] [--mode eager|compile]
    python3 bench_train.py --attention-only [--precision f32|bf16] [--device ...]
                           [--batch 8 --heads 12 --dim 768 --context 1024]
    python3 bench_train.py --compare _build/bench/bench-train [--rounds 7]
                           [--timeout S] [--with-compile [--compile-timeout S]] ...

The step is bench-train's: the preset models of ch_nn_preset, cross-entropy,
Adam (lr 1e-3; --optimizer adamw: AdamW with PyTorch's weight decay 0.01,
as bench-train --optimizer adamw), data already in memory, zero_grad +
forward + loss + backward + optimizer step; 3 warm-up steps, then the
median of --steps timed steps, reported as batch / median. The image models
(mlp, cnn, resnet of --depth, 16 channels wide) take random normal 1x28x28
images and labels i % 10; the gpt (dropout 0) takes --batch windows of
--context random tokens and random targets, and reports tokens/s too
(batch * context / median). Without --model: mlp and cnn.

--device cuda:N: the model, the data and the optimizer on that GPU; each
step is timed between two torch.cuda.synchronize() calls; the optimizer is
the fused one (fused=True, as nanoGPT's), and the peak memory is
torch.cuda.max_memory_allocated from before the model was moved there.
bench-train runs on the same device (cpu is its host, cuda:N its cuda:N).

--precision bf16: mixed precision, ours `bench-train --precision bf16`,
PyTorch's forward and loss under torch.autocast(device, torch.bfloat16).
--tf32 sets torch.backends.cuda.matmul.allow_tf32 and
torch.backends.cudnn.allow_tf32 (both False without it, explicitly: cuDNN's
is True by default), ours `bench-train --tf32` (ch_math_set(CH_MATH_TF32)).
--attention (the gpt, PyTorch's side): math writes attention out op by
op as Chorus's fixtures do (models.py), sdpa calls PyTorch's fused
scaled_dot_product_attention (is_causal), as nanoGPT does.
--mode compile: the model under torch.compile (the optimizer step eager);
a compilation that fails gives a row {"compile_failed": reason} and exit 0,
so that a comparison never stops on it.

The gpt's rows give its model FLOP rate and MFU as llm.c counts them:
6 N + 6 L C T FLOP per token (N every parameter, the tied embedding once)
against the device's listed dense peak for the step's arithmetic (PEAKS
below, bench-train's table: bf16 tensor, TF32 tensor or f32).

--attention-only times the fused causal attention alone at [batch, context,
3 dim] with --heads heads: qkv split, scaled_dot_product_attention
(is_causal) and the heads joined back to [batch, context, dim], forward and
backward (dqkv from a random dout), in --precision (bf16: the tensors in
bf16); ours `bench-train --attention-only` (ch_attention_packed_mixed and
its backward, qkv in f32, the products in --precision). FLOP of one forward
and backward: 7 B H T^2 hd (the causal half of 2 + 5 products).

--compare runs our bench-train (CMD: a path, or a command split as the
shell would) and this script in turn, each in a fresh process with the
same thread count and device, --rounds times (ours, PyTorch, PyTorch,
ours, ...: PyTorch first in every other round), and prints for each model
the median of the per-round medians, their spread and the speed ratio ours
/ PyTorch's, and each side's peak memory: on the CPU the process's peak
resident memory (ru_maxrss read by itself after its training, before
bench-train times the GEMMs alone: the whole process, libraries included,
measured the same way on both sides), on a GPU the device's peak bytes in
use (ours: ch_device_memory_stats' peak_bytes; PyTorch:
max_memory_allocated). Interleaving matters on a shared machine: absolute
rates drift by 2x within minutes, the ratio within a round much less.
--timeout S ends a run that takes longer (then the comparison stops there
and says so); --with-compile adds one run of PyTorch under torch.compile
as an anchor after the rounds (not interleaved), cut at --compile-timeout.
With --json (one model) the last line is the comparison as one JSON object.
"""
import argparse
import json
import os
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import time

# Listed dense peaks in TFLOP/s by device name: the first row whose key the
# name contains. bf16 on tensor cores, TF32 on tensor cores, plain f32;
# None where not listed (no MFU then). bench/bench-train.c has the same
# table: change both.
PEAKS = [
    ("H100 PCIe", "H100 PCIe", {"bf16": 756.0, "tf32": None, "f32": None}),
    ("H100 NVL", "H100 NVL", {"bf16": None, "tf32": None, "f32": None}),
    ("GH200", "GH200", {"bf16": None, "tf32": None, "f32": None}),
    ("H200 NVL", "H200 NVL", {"bf16": None, "tf32": None, "f32": None}),
    ("H200", "H200", {"bf16": 989.4, "tf32": 494.7, "f32": 66.9}),
    ("H100", "H100 SXM", {"bf16": 989.4, "tf32": 494.7, "f32": 66.9}),
    ("A100", "A100", {"bf16": 312.0, "tf32": 156.0, "f32": 19.5}),
]


def device_peak(name, math):
    """(TFLOP/s or None, the table's row label or "") for a device name."""
    for key, label, peaks in PEAKS:
        if key in name:
            return peaks.get(math), label
    return None, ""


def math_kind(args):
    """The step's arithmetic: bf16 under autocast, tf32 with --tf32 on a GPU
    (the CPU computes f32 products in f32 either way), else f32."""
    if args.precision == "bf16":
        return "bf16"
    return "tf32" if args.tf32 and is_cuda(args) else "f32"


def gpt_flop_per_token(params, args):
    """llm.c's count: 6 N + 6 L C T."""
    return 6 * params + 6 * args.layers * args.dim * args.context


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


def is_cuda(args):
    return args.device.startswith("cuda")


def setup_torch(args):
    """Threads, TF32 both ways, the device; returns (torch, device)."""
    import torch
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit(f"bench_train: --device {args.device}: torch.cuda.is_available() is False "
                     f"(PyTorch {torch.__version__}, built for CUDA {torch.version.cuda})")
        torch.cuda.set_device(device)
    return torch, device


def sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(torch, device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def model_data(kind, batch, args, device):
    """The model, its inputs and its targets on device, flattened as the loss takes them."""
    import torch
    torch.manual_seed(1)
    from models import preset
    model = preset(kind, **torch_config(kind, args)).to(device)
    if kind == "gpt":
        x = torch.randint(0, args.vocab, (batch, args.context), device=device)
        labels = torch.randint(0, args.vocab, (batch * args.context,), device=device)
        return model, x, labels, lambda y: y.reshape(-1, args.vocab)
    x = torch.randn(batch, 1, 28, 28, device=device)
    return model, x, torch.arange(batch, device=device) % 10, lambda y: y


def make_optimizer(torch, params, args, device):
    kind = torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.Adam
    extra = {"fused": True} if device.type == "cuda" else {}
    return kind(params, lr=1e-3, **extra)


def train_rate(kind, batch, steps, args):
    """samples/s, the parameter count, the device's peak bytes (GPU) or None."""
    torch, device = setup_torch(args)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model, x, labels, flat = model_data(kind, batch, args, device)
    params = sum(p.numel() for p in model.parameters())  # each tensor once: wte is lm_head
    opt = make_optimizer(torch, model.parameters(), args, device)
    if args.mode == "compile":
        model = torch.compile(model)
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    half = args.precision == "bf16"
    for s in range(-3, steps):
        sync(torch, device)
        t0 = time.perf_counter()
        opt.zero_grad()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=half):
            loss = loss_fn(flat(model(x)), labels)
        loss.backward()
        opt.step()
        sync(torch, device)
        if s >= 0:
            times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return batch / statistics.median(times), params, peak


def measure_row(kind, args):
    import torch
    try:
        rate, params, peak = train_rate(kind, args.batch, args.steps, args)
    except Exception as e:  # noqa: BLE001 - any failure of the compiler
        if args.mode != "compile":
            raise
        reason = f"{type(e).__name__}: {e}".strip().splitlines()
        return {"device": args.device, "model": kind, "mode": "compile",
                "compile_failed": reason[0][:300] if reason else type(e).__name__}
    device = torch.device(args.device)
    math = math_kind(args)
    row = {"device": args.device, "device_name": device_name(torch, device), "model": kind,
           "batch": args.batch, "samples_per_s": round(rate, 1), "params": params,
           "math": math, "mode": args.mode,
           "optimizer": args.optimizer + (" (fused)" if device.type == "cuda" else "")}
    if kind == "gpt":
        # From the unrounded rate: at a small batch, samples/s to 0.1 times
        # the context moves tokens/s in steps of several percent.
        row["tokens_per_s"] = round(rate * args.context, 1)
        row["context"] = args.context
        row["attention"] = args.attention
        fpt = gpt_flop_per_token(params, args)
        tflops = fpt * rate * args.context / 1e12
        row.update(flop_per_token=fpt, tflops=round(tflops, 3))
        peak_tflops, label = device_peak(row["device_name"], math)
        if peak_tflops:
            row.update(peak_tflops=peak_tflops, peak_of=f"{label} {math}",
                       mfu=round(tflops / peak_tflops, 4))
    if args.precision != "f32":
        row["precision"] = args.precision
    if peak is not None:
        row["peak_bytes"] = peak
    # The process's peak resident memory after the training (Linux: KiB),
    # as bench-train reads its own.
    row["max_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)
    row.update(threads=torch.get_num_threads(), torch=torch.__version__,
               torch_cuda=torch.version.cuda)
    return row


def attention_row(args):
    """Fused causal attention forward and backward alone, as bench-train --attention-only."""
    torch, device = setup_torch(args)
    from torch.nn import functional as F
    B, T, C, H = args.batch, args.context, args.dim, args.heads
    hd = C // H
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    gen = torch.Generator(device=device).manual_seed(1)
    qkv = torch.randn(B, T, 3 * C, device=device, dtype=dtype, generator=gen, requires_grad=True)
    dout = torch.randn(B, T, C, device=device, dtype=dtype, generator=gen)

    def forward():
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).contiguous().view(B, T, C)

    f, b, s = [], [], []
    for i in range(-3, args.steps):
        sync(torch, device)
        t0 = time.perf_counter()
        o = forward()
        sync(torch, device)
        t1 = time.perf_counter()
        o.backward(dout)
        sync(torch, device)
        t2 = time.perf_counter()
        qkv.grad = None
        if i >= 0:
            f.append(t1 - t0)
            b.append(t2 - t1)
            s.append(t2 - t0)
    step = statistics.median(s)
    flop = 7 * B * H * T * T * hd
    tflops = flop / step / 1e12
    name = device_name(torch, device)
    row = {"device": args.device, "device_name": name, "attention_only": True, "batch": B,
           "heads": H, "context": T, "head_dim": hd, "precision": args.precision,
           "forward_ms": round(1e3 * statistics.median(f), 4),
           "backward_ms": round(1e3 * statistics.median(b), 4),
           "step_ms": round(1e3 * step, 4), "flop": flop, "tflops": round(tflops, 3)}
    peak_tflops, label = device_peak(name, math_kind(args))
    if peak_tflops:
        row.update(peak_tflops=peak_tflops, peak_of=f"{label} {math_kind(args)}",
                   mfu=round(tflops / peak_tflops, 4))
    if device.type == "cuda":
        row["peak_bytes"] = torch.cuda.max_memory_allocated(device)
    row.update(torch=torch.__version__, torch_cuda=torch.version.cuda)
    return row


def measure(args):
    import torch
    torch.set_num_threads(args.threads)
    rows = [attention_row(args)] if args.attention_only else [
        measure_row(m, args) for m in args.models]
    if args.json:
        print(json.dumps(rows))
        return
    if args.attention_only:
        r = rows[0]
        print(f"{r['device']:<10} attention B {r['batch']}, H {r['heads']}, T {r['context']}, "
              f"hd {r['head_dim']}, {r['precision']}: forward {r['forward_ms']:.3f} ms, "
              f"backward {r['backward_ms']:.3f} ms, both {r['step_ms']:.3f} ms, "
              f"{r['tflops']:.2f} TFLOP/s{mfu_text(r)}")
        return
    print(f"{'device':<10} {'model':<6} {'batch':>6} {'samples/s':>14} {'tokens/s':>14}  "
          f"(PyTorch {torch.__version__}, {torch.get_num_threads()} threads, {args.mode})")
    for r in rows:
        if "compile_failed" in r:
            print(f"{r['device']:<10} {r['model']:<6} compile failed: {r['compile_failed']}")
            continue
        tokens = f"{r['tokens_per_s']:>14.1f}" if "tokens_per_s" in r else f"{'-':>14}"
        print(f"{r['device']:<10} {r['model']:<6} {r['batch']:>6} {r['samples_per_s']:>14.1f} "
              f"{tokens}")
        if "tflops" in r:
            print(f"{r['device']:<10} {r['model']:<6} {r['batch']:>6}  {r['params']} parameters, "
                  f"{r['flop_per_token']:.4g} FLOP a token (6N + 6LCT): {r['tflops']:.2f} "
                  f"TFLOP/s{mfu_text(r)}")


def mfu_text(r):
    if "mfu" in r:
        return f", MFU {100 * r['mfu']:.1f}% of {r['peak_tflops']:.1f} ({r['peak_of']})"
    return f", MFU -: no listed peak for \"{r.get('device_name', '?')}\""


# ---- --compare ------------------------------------------------------------------


class RunFailed(Exception):
    pass


def run_json(cmd, env, timeout):
    """The last line of cmd's output as JSON. The command runs in a session of
    its own, so that a timeout ends its children too (torch.compile's
    workers)."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout or None)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise RunFailed(f"no result within {timeout:.0f} s") from None
    if p.returncode != 0:
        last = (err.strip().splitlines() or ["no output"])[-1]
        raise RunFailed(f"exit {p.returncode}: {last[:300]}")
    lines = out.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        raise RunFailed(f"no JSON result: {(lines or ['no output'])[-1][:200]}") from None


def model_options(kind, args):
    """The command-line options of a model's configuration, the same for
    bench-train and this script."""
    return [w for k, v in model_config(kind, args).items() for w in ("--" + k, str(v))]


def ours_device(device):
    """bench-train's name of the device: cpu is its host."""
    return "host" if device == "cpu" else ("cuda:0" if device == "cuda" else device)


def commands(args):
    """bench-train's command and this script's, the same options on both."""
    common = ["--batch", str(args.batch), "--steps", str(args.steps),
              "--precision", args.precision, "--optimizer", args.optimizer]
    if args.tf32:
        common.append("--tf32")
    ours = shlex.split(args.compare) + ["--devices", ours_device(args.device), "--json"] + common
    theirs = [sys.executable, os.path.abspath(__file__), "--json", "--threads", str(args.threads),
              "--attention", args.attention, "--device", args.device] + common
    if args.attention_only:
        extra = ["--attention-only", "--heads", str(args.heads), "--dim", str(args.dim),
                 "--context", str(args.context)]
    elif len(args.models) == 1:
        extra = ["--model", args.models[0]] + model_options(args.models[0], args)
    else:
        extra = []
    return ours + extra, theirs + extra


def rate_of(row):
    """What a row's speed is measured in: tokens/s for the gpt, forward and
    backward per second for the attention alone, else samples/s."""
    if row.get("attention_only"):
        return 1e3 / row["step_ms"]
    return row["tokens_per_s"] if row["model"] == "gpt" else row["samples_per_s"]


def memory_mib(row, device):
    """A run's peak memory: the device's peak bytes on a GPU, the process's
    peak RSS on the CPU."""
    if device.startswith("cuda"):
        return row["peak_bytes"] / 1048576.0 if "peak_bytes" in row else None
    return row.get("max_rss_mib")


def row_key(row):
    return "attention" if row.get("attention_only") else row["model"]


def compile_anchor(args, env, timeout):
    """One run of PyTorch under torch.compile: its row, or {"error": ...}."""
    _, theirs = commands(args)
    try:
        rows = run_json(theirs + ["--mode", "compile"], env, timeout)
    except RunFailed as e:
        return {"error": f"compile failed: {e}"}
    row = rows[0] if rows else {}
    if "compile_failed" in row:
        return {"error": f"compile failed: {row['compile_failed']}"}
    return row


def median_or_none(values, digits=4):
    """The median to `digits` significant digits, or None without values."""
    values = [v for v in values if v is not None]
    return float(f"{statistics.median(values):.{digits}g}") if values else None


def side_summary(rows, device):
    """A side's rounds of one model: medians, and what does not change."""
    if not rows:
        return None
    last = rows[-1]
    out = {"rate": median_or_none([rate_of(r) for r in rows], 6),
           "rates": [float(f"{rate_of(r):.6g}") for r in rows],
           "peak_mib": median_or_none([memory_mib(r, device) for r in rows], 6)}
    for k in ("tflops", "mfu", "forward_ms", "backward_ms", "step_ms", "gemm_share",
              "launches_per_step", "gemms_per_step", "gemm_time_share"):
        if k in last:
            out[k] = median_or_none([r.get(k) for r in rows])
    for k in ("peak_tflops", "peak_of", "params", "flop_per_token", "optimizer", "math",
              "device_name", "torch", "torch_cuda", "flop"):
        if k in last:
            out[k] = last[k]
    if "fallbacks" in last:
        out["fallbacks"] = max(r.get("fallbacks", 0) for r in rows)
        out["fallback_ops"] = sorted({op for r in rows for op in r.get("fallback_ops", [])})
    return out


def compare(args, env=None, deadline=None):
    """The interleaved rounds; prints the table and returns one summary per
    model (dicts, see side_summary), with "error" where a run failed.
    deadline (time.monotonic()'s clock): no round starts that the longest
    run so far says would not end by then, and no run goes past it; a
    comparison cut so has "cut" (why) and the rounds it finished."""
    env = dict(env if env is not None else os.environ, OMP_NUM_THREADS=str(args.threads))
    ours_cmd, theirs_cmd = commands(args)
    keys = ["attention"] if args.attention_only else args.models
    rows = {(side, m): [] for side in ("ours", "torch") for m in keys}
    error = cut = None
    done = 0
    longest = 0.0
    for r in range(args.rounds):
        if deadline is not None and r > 0 and deadline - time.monotonic() < 2 * longest:
            cut = f"the budget left no time for round {r + 1} of {args.rounds}"
            print(f"round {r + 1}/{args.rounds}: not run: {cut}", flush=True)
            break
        # ABBA: every other round PyTorch goes first, so that a drift of
        # the machine during a round favours neither side.
        for side in ("ours", "torch") if r % 2 == 0 else ("torch", "ours"):
            timeout, by_deadline = args.timeout, False
            if deadline is not None:
                left = max(1.0, deadline - time.monotonic())
                if not timeout or left < timeout:
                    timeout, by_deadline = left, True
            t0 = time.monotonic()
            try:
                got = run_json(ours_cmd if side == "ours" else theirs_cmd, env, timeout)
            except RunFailed as e:
                why = f"{'ours' if side == 'ours' else 'PyTorch'}, round {r + 1}: {e}"
                if by_deadline and str(e).startswith("no result"):
                    cut = f"the budget ended during {why}"
                else:
                    error = why
                break
            longest = max(longest, time.monotonic() - t0)
            for row in got:
                if row_key(row) in keys:
                    rows[(side, row_key(row))].append(row)
            missing = [m for m in keys if len(rows[(side, m)]) <= r]
            if missing:
                error = f"{side} gave no rate for {', '.join(missing)}"
                break
        if error or cut:
            print(f"round {r + 1}/{args.rounds}: stopped: {error or cut}", flush=True)
            break
        done += 1
        line = ", ".join(f"{m} {rate_of(rows[('ours', m)][-1]):.1f} / "
                         f"{rate_of(rows[('torch', m)][-1]):.1f}" for m in keys)
        mem = ", ".join(f"{m} {memory_mib(rows[('ours', m)][-1], args.device) or 0:.0f} / "
                        f"{memory_mib(rows[('torch', m)][-1], args.device) or 0:.0f}"
                        for m in keys)
        print(f"round {r + 1}/{args.rounds}: ours / PyTorch {unit(keys)}: {line}; peak "
              f"{'memory' if is_cuda(args) else 'RSS'} {mem} MiB", flush=True)
    results = []
    for m in keys:
        ours = [x for x in rows[("ours", m)]][:done]
        theirs = [x for x in rows[("torch", m)]][:done]
        res = {"model": m, "device": args.device, "precision": math_kind(args),
               "batch": args.batch, "steps": args.steps, "rounds": done,
               "unit": unit([m]), "ours": side_summary(ours, args.device),
               "pytorch_eager": side_summary(theirs, args.device)}
        if m in ("gpt", "attention"):
            res["context"] = args.context
            res["config"] = model_config("gpt", args)
            if m == "attention":
                res["config"] = {"heads": args.heads, "dim": args.dim,
                                 "context": args.context}
        elif m == "resnet":
            res["config"] = model_config(m, args)
        if m == "gpt":
            res["pytorch_attention"] = args.attention
        ratios = [rate_of(a) / rate_of(b) for a, b in zip(ours, theirs)]
        if ratios:
            res["ratio"] = round(statistics.median(ratios), 4)
            res["ratio_range"] = [round(min(ratios), 4), round(max(ratios), 4)]
        if error:
            res["error"] = error
        if cut:
            res["cut"] = cut
            if not ratios:
                res["error"] = f"not run: {cut}"
        res["notes"] = consistency_notes(res)
        results.append(res)
    if args.with_compile and not error:
        for res in results:
            if res["model"] == "attention":
                continue
            one = argparse.Namespace(**vars(args))
            one.models = [res["model"]]
            row = compile_anchor(one, env, args.compile_timeout)
            res["pytorch_compile"] = ({"error": row["error"]} if "error" in row
                                      else side_summary([row], args.device))
    print_comparison(args, results)
    return results


def consistency_notes(res):
    """What should agree between the sides and does not."""
    notes = []
    a, b = res.get("ours") or {}, res.get("pytorch_eager") or {}
    if "params" in a and "params" in b and a["params"] != b["params"]:
        notes.append(f"parameter counts differ: ours {a['params']}, PyTorch {b['params']}")
    if a and b and a.get("peak_tflops") != b.get("peak_tflops"):
        notes.append(f"the sides took different peaks: {a.get('peak_tflops')} "
                     f"({a.get('peak_of')}) and {b.get('peak_tflops')} ({b.get('peak_of')})")
    if a.get("fallbacks"):
        notes.append(f"ops ran on the host for {res['device']}: "
                     f"{', '.join(a.get('fallback_ops', []))}")
    return notes


def print_comparison(args, results):
    what = "attention alone" if args.attention_only else f"batch {args.batch}"
    attention = (f", PyTorch's attention {args.attention}"
                 if "gpt" in [r["model"] for r in results] else "")
    print(f"\n{args.device}, {args.threads} threads, {what}, {math_kind(args)}{attention}, "
          f"optimizer {args.optimizer}, median of {args.steps} steps per run, "
          f"{results[0]['rounds'] if results else 0} rounds (median [min, max] over rounds)")
    mem = "peak device MiB" if is_cuda(args) else "peak RSS MiB"
    print(f"{'model':<9} {'ours':>24} {'PyTorch':>24} {'ours/PyTorch':>22} "
          f"{'MFU ours/PyTorch':>18} {mem + ' ours/PyTorch':>28} {'GEMM share':>10}  compile")
    for res in results:
        a, b = res["ours"] or {}, res["pytorch_eager"] or {}

        def cell(side, fmt):
            v = side.get("rates") or []
            return (f"{statistics.median(v):{fmt}} [{min(v):{fmt}}, {max(v):{fmt}}]"
                    if v else "-")
        ratio = (f"{res['ratio']:.3f} [{res['ratio_range'][0]:.2f}, {res['ratio_range'][1]:.2f}]"
                 if "ratio" in res else "-")
        mfu = "/".join(f"{100 * s['mfu']:.1f}%" if s.get("mfu") is not None else "-"
                       for s in (a, b))
        mems = "/".join(f"{s['peak_mib']:.0f}" if s.get("peak_mib") is not None else "-"
                        for s in (a, b))
        comp = res.get("pytorch_compile")
        comp = ("-" if comp is None else comp.get("error") or
                f"{comp['rate']:.1f} {res['unit']}")
        fmt = ".2f" if res["model"] == "attention" else ".0f"
        share = f"{a['gemm_share']:.2f}" if a.get("gemm_share") is not None else "-"
        print(f"{res['model']:<9} {cell(a, fmt):>24} {cell(b, fmt):>24} {ratio:>22} {mfu:>18} "
              f"{mems:>28} {share:>10}  {comp}")
        for n in res["notes"]:
            print(f"  note: {n}")
        if res.get("error"):
            print(f"  stopped: {res['error']}")
        elif res.get("cut"):
            print(f"  cut: {res['cut']}")
    if args.attention_only:
        print("(attention: forward and backward per second; the products' FLOP rates are in "
              "the JSON)")


def unit(models):
    if models == ["attention"]:
        return "fwd+bwd/s"
    return "tokens/s" if models == ["gpt"] else (
        "samples/s" if "gpt" not in models else "samples/s (gpt: tokens/s)")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["mlp", "cnn", "resnet", "gpt"],
                   help="one model (default: mlp and cnn)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", action="store_true")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--compare", metavar="BENCH_TRAIN",
                   help="our bench-train program (a command: split as the shell would): run "
                   "it and PyTorch in turn")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--timeout", type=float, default=0,
                   help="--compare: seconds a run may take (default: no limit)")
    p.add_argument("--with-compile", action="store_true",
                   help="--compare: one run of PyTorch under torch.compile after the rounds")
    p.add_argument("--compile-timeout", type=float, default=300)
    p.add_argument("--depth", type=int, default=20, help="resnet: 6n+2 layers")
    p.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                   help="bf16: autocast (PyTorch), --precision bf16 (ours)")
    p.add_argument("--tf32", action="store_true",
                   help="f32 products on TF32 (allow_tf32; ours ch_math_set(CH_MATH_TF32))")
    p.add_argument("--optimizer", choices=["adam", "adamw"], default="adam")
    p.add_argument("--mode", choices=["eager", "compile"], default="eager",
                   help="PyTorch's side: eager, or the model under torch.compile")
    p.add_argument("--attention", choices=["math", "sdpa"], default="math",
                   help="the gpt's attention on PyTorch's side: op by op, or "
                   "scaled_dot_product_attention")
    p.add_argument("--attention-only", action="store_true",
                   help="time the fused causal attention alone (forward and backward)")
    for name, default in (("layers", 4), ("heads", 4), ("dim", 128), ("context", 64),
                          ("vocab", 256)):
        p.add_argument("--" + name, type=int, default=default, help="gpt")
    args = p.parse_args(argv)
    sizes = (args.batch, args.steps, args.threads, args.rounds, args.layers, args.heads,
             args.dim, args.context, args.vocab)
    if min(sizes) < 1:
        p.error("--batch, --steps, --threads, --rounds and the gpt's sizes must be >= 1")
    if args.depth < 8 or (args.depth - 2) % 6:
        p.error("--depth must be 6n+2 with n >= 1 (8, 14, 20, ...)")
    if args.dim % args.heads:
        p.error("--dim must be a multiple of --heads")
    if not (args.device == "cpu" or args.device == "cuda" or
            (args.device.startswith("cuda:") and args.device[5:].isdigit())):
        p.error("--device is cpu, cuda or cuda:N")
    if args.attention_only and args.model:
        p.error("--attention-only takes no --model")
    args.models = [args.model] if args.model else ["mlp", "cnn"]
    return args


def main():
    args = parse()
    if args.compare:
        results = compare(args)
        if args.json and len(results) == 1:
            print(json.dumps(results[0]))
        sys.exit(1 if any(r.get("error") for r in results) else 0)
    else:
        measure(args)


if __name__ == "__main__":
    main()
