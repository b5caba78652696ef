#!/usr/bin/env python3
"""The GPU check's steps beside PyTorch: training steps, attention alone, the fortunes.

    side_by_side.py train     --ours CMD --out FILE [--device cuda:0] [--budget S] ...
    side_by_side.py attention --ours CMD --out FILE [--device cuda:0] [--budget S] ...
    side_by_side.py fortunes  --chorus-train CMD --data DIR --out FILE [--budget S] ...

tests/gpu/check.sh runs the three as its steps side-by-side, attention and
fortunes; docs/GPU_CHECK.md says what they show. Each merges its part into
the JSON file --out (OUTDIR/side-by-side.json: the machine, the versions, the
date, and "cases", "attention" or "fortunes") and prints a table; its last
line, "summary: ...", is the check's row. CMD is a command split as the
shell would (check.sh passes a wrapper that sets the library's paths, then
the program), so that PyTorch's runs keep this process's environment.

train: GPT-2 124M as published (12 layers, 12 heads, width 768, vocabulary
50257, context 1024, the embedding tied to the output, dropout 0) at batch
8 in f32 (TF32 off), f32 with TF32 on, and bf16 (autocast's rules; TF32
off), then ResNet-20 and the cnn in f32 at batch 256; AdamW everywhere;
PyTorch's attention scaled_dot_product_attention (is_causal). Each case is
docs/pytorch/bench_train.py --compare: fresh processes, ours and PyTorch's
eager step interleaved over --rounds rounds (ours, PyTorch, PyTorch, ours,
...), medians. After every case has its rounds, PyTorch under
torch.compile runs once per case as an anchor, in the order bf16, TF32,
f32, ResNet-20, cnn, while the budget lasts ("compile failed: ..." where it
fails, "not run: ..." where no time was left).

attention: the fused causal attention forward and backward at GPT-2 124M's
shapes (batch 8, 12 heads, T 1024, head size 64) in bf16 and f32, ours
(bench-train --attention-only: ch_attention_packed_mixed and its backward)
against PyTorch's scaled_dot_product_attention.

fortunes: the default gpt (4 layers, width 128, context 64, batch 32) on
the fortunes text for --steps steps (AdamW 1e-3, constant rate, seed 1) on
cuda:0 and on the host with chorus-train, and with docs/pytorch/train_gpt.py
on the GPU; the validation losses, and a failure when cuda:0's differs from
the host's by more than --tolerance.

Exit status: 0 when every part ran; 3 when the budget left some part not
run (the check's "partial", which fails nothing); 1 when a run failed or
the fortunes' losses differ by more than the tolerance.
"""
import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
PYTORCH_DIR = os.path.join(SRC, "docs", "pytorch")
sys.path.insert(0, PYTORCH_DIR)
import bench_train  # noqa: E402 (imports no torch itself)

GPT2 = {"layers": 12, "heads": 12, "dim": 768, "context": 1024, "vocab": 50257}
# The rehearsal's shapes (--tiny): small enough for two CPU cores.
TINY_GPT = {"layers": 2, "heads": 4, "dim": 128, "context": 128, "vocab": 50257}
FORTUNES_GPT = ["--layers", "4", "--heads", "4", "--dim", "128", "--context", "64",
                "--batch", "32"]


class Clock:
    """The step's budget: seconds left, less a reserve for writing out."""

    def __init__(self, budget):
        self.end = time.monotonic() + budget

    def left(self, reserve=5):
        return self.end - time.monotonic() - reserve

    def share(self, weight, weights_left, reserve=10):
        """A deadline for one part: its weight's share of what is left."""
        return time.monotonic() + max(0.0, self.left(reserve)) * weight / weights_left


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def torch_info(device):
    """PyTorch's versions and what it sees, from a process of its own (this
    one imports no torch); {"error": ...} when it cannot be imported."""
    code = ("import json, torch\n"
            "d = {'torch': torch.__version__, 'torch_cuda': torch.version.cuda,\n"
            "     'cuda_available': torch.cuda.is_available()}\n"
            "if torch.cuda.is_available():\n"
            "    d['cudnn'] = torch.backends.cudnn.version()\n"
            "    d['device_name'] = torch.cuda.get_device_name(%r)\n"
            "print(json.dumps(d))\n" % (device if device.startswith("cuda") else "cuda",))
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120)
    except subprocess.TimeoutExpired:
        return {"error": "python3 -c 'import torch' took more than 120 s"}
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"import torch failed: {last[:200]}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def merge_out(args, key, value, info):
    """Writes `value` under `key` into --out with the header, keeping the
    other steps' keys (written by this run: check.sh removes the file first)."""
    data = {}
    if os.path.exists(args.out):
        try:
            with open(args.out) as f:
                data = json.load(f)
        except ValueError:
            data = {}
    data.update({
        "what": "Chorus beside PyTorch on one device, written by tests/gpu/side_by_side.py "
                "(tests/gpu/check.sh); docs/GPU_CHECK.md says how to read it",
        "date": utc_now(), "device": args.device,
        "device_name": args.gpu_name or info.get("device_name"),
        "driver": args.driver, "cuda_driver": args.cuda_driver,
        "cuda_toolkit": args.cuda_toolkit, "torch": info.get("torch"),
        "torch_cuda": info.get("torch_cuda"), "cudnn": info.get("cudnn"),
        "source": args.source, "flop_count": "6N + 6LCT a token (llm.c), N every parameter "
        "with the tied embedding once; MFU against the listed dense peak of the step's "
        "arithmetic (bf16 tensor, TF32 tensor, f32)",
    })
    data[key] = value
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, args.out)


def need_torch(args):
    info = torch_info(args.device)
    if "error" in info:
        print(f"PyTorch: {info['error']}")
        print(f"summary: no PyTorch: {info['error']}")
        sys.exit(1)
    if args.device.startswith("cuda") and not info.get("cuda_available"):
        msg = (f"PyTorch {info['torch']} (CUDA {info['torch_cuda']}) sees no GPU "
               f"(torch.cuda.is_available() is False)")
        print(f"summary: {msg}")
        sys.exit(1)
    print(f"PyTorch {info['torch']}, CUDA {info.get('torch_cuda')}, cuDNN {info.get('cudnn')}, "
          f"device {info.get('device_name', 'cpu')}", flush=True)
    return info


def compare_argv(args, model, precision, tf32, batch, steps, timeout, extra):
    argv = ["--compare", args.ours, "--device", args.device, "--batch", str(batch),
            "--steps", str(steps), "--rounds", str(args.rounds), "--precision", precision,
            "--optimizer", "adamw", "--attention", "sdpa", "--threads", str(args.threads),
            "--timeout", str(max(1, int(timeout)))] + extra
    if model:
        argv += ["--model", model]
    if tf32:
        argv.append("--tf32")
    return argv


def gpt_options(shape):
    return [w for k, v in shape.items() for w in ("--" + k, str(v))]


def fmt_rate(v):
    return "-" if v is None else (f"{v:.0f}" if v >= 100 else f"{v:.2f}")


def pct(v):
    return "-" if v is None else f"{100 * v:.1f}%"


def mib(v):
    return "-" if v is None else f"{v:.0f}"


# ---- train ------------------------------------------------------------------


def train_cases(args):
    """(label, model, precision, tf32, batch, steps, per-run limit, weight,
    options). The weight is the case's share of the budget: a GPT-2 step is
    some 50 times the images' and each of its cases matters more."""
    gpt = TINY_GPT if args.tiny else GPT2
    gb = args.gpt_batch or (2 if args.tiny else 8)
    ib = args.image_batch or (16 if args.tiny else 256)
    depth = 8 if args.tiny else 20
    gs = args.steps or (3 if args.tiny else 10)
    ims = args.steps or (3 if args.tiny else 20)
    name = "gpt-tiny" if args.tiny else "gpt2-124m"
    return [
        (f"{name} f32", "gpt", "f32", False, gb, gs, 180, 3, gpt_options(gpt)),
        (f"{name} tf32", "gpt", "f32", True, gb, gs, 180, 3, gpt_options(gpt)),
        (f"{name} bf16", "gpt", "bf16", False, gb, gs, 180, 3, gpt_options(gpt)),
        (f"resnet-{depth} f32", "resnet", "f32", False, ib, ims, 90, 1,
         ["--depth", str(depth)]),
        ("cnn f32", "cnn", "f32", False, ib, ims, 90, 1, []),
    ]


def run_compare(argv, deadline):
    """bench_train.py --compare in this process (it starts the runs)."""
    ba = bench_train.parse(argv)
    return bench_train.compare(ba, deadline=deadline)[0]


def verdict(res):
    """(partial, failed) of one comparison: cut by the budget, or a run failed."""
    if res.get("cut"):
        return True, False
    return False, bool(res.get("error"))


def cmd_train(args):
    info = need_torch(args)
    clock = Clock(args.budget)
    results, partial, failed = [], False, False
    cases = train_cases(args)
    weights = sum(c[7] for c in cases)
    for label, model, precision, tf32, batch, steps, cap, weight, extra in cases:
        # Each case gets its weight's share of what is left (what one
        # leaves goes to those after it); a run stops at its cap.
        deadline = clock.share(weight, weights)
        weights -= weight
        left = deadline - time.monotonic()
        if left < 15:
            results.append({"case": label, "model": model, "cut": "no time left in the budget",
                            "error": "not run: no time left in the budget"})
            partial = True
            print(f"\n== {label}: not run, no time left", flush=True)
            continue
        print(f"\n== {label}: batch {batch}, {steps} steps a run, {args.rounds} rounds, "
              f"{left:.0f} s for the case, a run cut at {cap} s", flush=True)
        res = run_compare(compare_argv(args, model, precision, tf32, batch, steps, cap, extra),
                          deadline)
        res["case"] = label
        res["precision"] = "tf32" if tf32 else precision
        p, f = verdict(res)
        partial |= p
        failed |= f
        results.append(res)
    # The anchors: torch.compile, once a case, while time lasts.
    order = [2, 1, 0, 3, 4]
    for i in order:
        res = results[i]
        if "ratio" not in res or res.get("error"):
            continue
        label, model, precision, tf32, batch, steps, _, _, extra = cases[i]
        left = clock.left(10)
        if left < 40 or args.no_compile:
            why = "--no-compile" if args.no_compile else "no time left in the budget"
            res["pytorch_compile"] = {"error": f"not run: {why}"}
            partial |= not args.no_compile
            continue
        timeout = min(args.compile_timeout, left)
        print(f"\n== {label}: torch.compile anchor, cut at {timeout:.0f} s", flush=True)
        ba = bench_train.parse(compare_argv(args, model, precision, tf32, batch, steps, timeout,
                                            extra))
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        row = bench_train.compile_anchor(ba, env, timeout)
        if "error" in row and "no result within" in row["error"] and timeout < args.compile_timeout:
            # Cut by the budget, not by the compiler's own limit.
            row = {"error": f"not run to the end: the budget's {timeout:.0f} s ran out"}
            partial = True
        res["pytorch_compile"] = ({"error": row["error"]} if "error" in row
                                  else bench_train.side_summary([row], args.device))
        comp = res["pytorch_compile"]
        print(f"   {comp.get('error') or fmt_rate(comp['rate']) + ' ' + res['unit']}", flush=True)
    merge_out(args, "cases", results, info)
    print("\n== table")
    print_train(results, args.device)
    print("summary: " + train_summary(results))
    sys.exit(1 if failed else 3 if partial else 0)


def print_train(results, device):
    print(f"{'case':<16} {'ours':>10} {'PyTorch':>10} {'ratio':>7} {'compile':>10} "
          f"{'MFU ours':>9} {'MFU PyT':>8} {'peak':>12} {'MiB ours':>9} {'MiB PyT':>8} "
          f"{'on host':>7} {'launches':>8} {'GEMM time':>9}")
    for r in results:
        if "ours" not in r:
            print(f"{r['case']:<16} {r.get('error', '')}")
            continue
        a, b = r["ours"] or {}, r["pytorch_eager"] or {}
        comp = r.get("pytorch_compile") or {}
        print(f"{r['case']:<16} {fmt_rate(a.get('rate')):>10} {fmt_rate(b.get('rate')):>10} "
              f"{r.get('ratio', float('nan')):>7.3f} "
              f"{fmt_rate(comp.get('rate')) if 'rate' in comp else '-':>10} "
              f"{pct(a.get('mfu')):>9} {pct(b.get('mfu')):>8} "
              f"{(str(a.get('peak_tflops')) + ' TF') if a.get('peak_tflops') else '-':>12} "
              f"{mib(a.get('peak_mib')):>9} {mib(b.get('peak_mib')):>8} "
              f"{a.get('fallbacks', '-'):>7} "
              f"{fmt_rate(a.get('launches_per_step')) if 'launches_per_step' in a else '-':>8} "
              f"{pct(a.get('gemm_time_share')):>9}")
        for n in r.get("notes", []):
            print(f"  note: {n}")
        if r.get("error"):
            print(f"  stopped: {r['error']}")
        if comp.get("error"):
            print(f"  torch.compile: {comp['error']}")
    print("(rates: the gpt in tokens/s, the others in samples/s; ratio: ours over PyTorch eager, "
          "median of the rounds' ratios; MFU: 6N + 6LCT against the peak shown, TFLOP/s; MiB: "
          f"{'peak device memory' if device.startswith('cuda') else 'peak RSS'}; on host: ops "
          "that ran on the host for the device)")


def train_summary(results):
    parts = []
    for r in results:
        if "ratio" in r:
            fb = (r["ours"] or {}).get("fallbacks")
            extra = f", {fb} op(s) on the host" if fb else ""
            mfu = (r["ours"] or {}).get("mfu")
            parts.append(f"{r['case']} {r['ratio']:.2f}x"
                         + (f" (MFU {100 * mfu:.1f}%)" if mfu is not None else "") + extra)
        else:
            parts.append(f"{r['case']} {r.get('error', 'no result')}")
        if r.get("cut") and "ratio" in r:
            parts[-1] += f" ({r['rounds']} round(s): {r['cut']})"
    return "ours/PyTorch eager: " + "; ".join(parts)


# ---- attention --------------------------------------------------------------


def cmd_attention(args):
    info = need_torch(args)
    clock = Clock(args.budget)
    shape = (["--heads", "4", "--dim", "128", "--context", "128"] if args.tiny else
             ["--heads", "12", "--dim", "768", "--context", "1024"])
    batch = args.gpt_batch or (2 if args.tiny else 8)
    steps = args.steps or (3 if args.tiny else 20)
    results, partial, failed = [], False, False
    for i, precision in enumerate(("bf16", "f32")):
        deadline = clock.share(1, 2 - i, 5)
        if deadline - time.monotonic() < 10:
            results.append({"precision": precision, "cut": "no time left",
                            "error": "not run: no time left in the budget"})
            partial = True
            continue
        print(f"\n== attention {precision}: batch {batch}, {' '.join(shape)}", flush=True)
        argv = compare_argv(args, None, precision, False, batch, steps, 90,
                            ["--attention-only"] + shape)
        res = run_compare(argv, deadline)
        res["precision"] = precision
        p, f = verdict(res)
        partial |= p
        failed |= f
        results.append(res)
    merge_out(args, "attention", results, info)
    print("\n== table")
    print(f"{'products':<9} {'ours fwd/bwd/both ms':>24} {'SDPA fwd/bwd/both ms':>24} "
          f"{'ratio':>6} {'TFLOP/s ours/SDPA':>18} {'on host':>7}")
    for r in results:
        if "ratio" not in r:
            print(f"{r['precision']:<9} {r.get('error', 'no result')}")
            continue
        a, b = r["ours"], r["pytorch_eager"]
        ms = ["/".join(f"{s[k]:.3f}" for k in ("forward_ms", "backward_ms", "step_ms"))
              for s in (a, b)]
        print(f"{r['precision']:<9} {ms[0]:>24} {ms[1]:>24} {r['ratio']:>6.3f} "
              f"{a['tflops']:>8.2f}/{b['tflops']:<9.2f} {a.get('fallbacks', '-'):>7}")
        for n in r.get("notes", []):
            print(f"  note: {n}")
    print("(B %d, T %s; FLOP of forward and backward 7 B H T^2 hd; ratio: ours' speed over "
          "SDPA's, median of the rounds')" % (batch, shape[5]))
    parts = []
    for r in results:
        if "ratio" not in r:
            parts.append(f"{r['precision']} {r.get('error', 'no result')}")
            continue
        a, b = r["ours"], r["pytorch_eager"]
        fb = a.get("fallbacks")
        parts.append(f"{r['precision']} ours {a['step_ms']:.3f} ms, SDPA {b['step_ms']:.3f} ms "
                     f"({r['ratio']:.2f}x)" + (f", {fb} op(s) on the host" if fb else ""))
    print("summary: forward+backward, " + "; ".join(parts))
    sys.exit(1 if failed else 3 if partial else 0)


# ---- fortunes ---------------------------------------------------------------


def run_lines(cmd, timeout, env=None):
    """(exit status or None on timeout, stdout lines, last stderr line)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, [], f"no result within {timeout:.0f} s"
    err = (p.stderr.strip().splitlines() or [""])[-1]
    return p.returncode, p.stdout.splitlines(), err


def result_json(lines):
    for line in lines:
        line = line.strip()
        if line.startswith("{") and '"val_loss"' in line:
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


def cmd_fortunes(args):
    clock = Clock(args.budget)
    common = ["--model", "gpt", "--data", args.data] + FORTUNES_GPT + [
        "--max-steps", str(args.fortune_steps), "--optimizer", "adamw", "--lr", "1e-3",
        "--schedule", "constant", "--seed", "1", "--json", "--quiet"]
    torch_cmd = [sys.executable, os.path.join(PYTORCH_DIR, "train_gpt.py"), "--data", args.data,
                 ] + FORTUNES_GPT + ["--max-steps", str(args.fortune_steps), "--lr", "1e-3",
                                     "--seed", "1", "--threads", str(args.threads),
                                     "--device", args.device]
    ours = bench_train.ours_device(args.device)
    runs = [("ours " + ours, shlex.split(args.chorus_train) + ["--devices", ours] + common),
            ("PyTorch " + args.device, torch_cmd),
            ("ours host" if ours != "host" else "ours host again",
             shlex.split(args.chorus_train) + ["--devices", "host"] + common)]
    out = {"model": "gpt, 4 layers, 4 heads, width 128, context 64, batch 32, vocabulary 256",
           "steps": args.fortune_steps, "optimizer": "AdamW 1e-3, constant, seed 1",
           "tolerance": args.tolerance, "runs": {}}
    failed = partial = False
    for name, cmd in runs:
        left = clock.left(5)
        if left < 10:
            out["runs"][name] = {"error": "not run: no time left in the budget"}
            partial = True
            continue
        t0 = time.monotonic()
        rc, lines, err = run_lines(cmd, left)
        secs = time.monotonic() - t0
        print(f"== {name}: {' '.join(shlex.quote(c) for c in cmd)}\n   exit {rc}, {secs:.0f} s",
              flush=True)
        res = result_json(lines)
        if rc != 0 or res is None:
            out["runs"][name] = {"error": f"exit {rc}: {err[:300]}" if rc is not None else err}
            print(f"   {out['runs'][name]['error']}")
            failed = True
            continue
        res["wall_s"] = round(secs, 1)
        out["runs"][name] = res
        print(f"   val_loss {res['val_loss']:.4f}, train_loss {res['train_loss']:.4f}, "
              f"{res['tokens_per_s']:.0f} tokens/s", flush=True)
    ours_dev = out["runs"].get("ours " + ours, {})
    host = out["runs"].get(runs[2][0], {})
    theirs = out["runs"].get("PyTorch " + args.device, {})
    losses = ", ".join(f"{n} {r['val_loss']:.4f}" if "val_loss" in r else f"{n} -"
                       for n, r in out["runs"].items())
    verdict = ""
    if "val_loss" in ours_dev and "val_loss" in host:
        diff = abs(ours_dev["val_loss"] - host["val_loss"])
        out["difference"] = round(diff, 4)
        out["passed"] = diff <= args.tolerance
        verdict = (f"; |{ours} - host| {diff:.4f} "
                   f"{'<=' if out['passed'] else '>'} {args.tolerance}")
        failed |= not out["passed"]
    if "val_loss" in ours_dev and "val_loss" in theirs:
        out["difference_pytorch"] = round(ours_dev["val_loss"] - theirs["val_loss"], 4)
    info = torch_info(args.device)
    merge_out(args, "fortunes", out, info)
    print("\n== table")
    for n, r in out["runs"].items():
        if "val_loss" in r:
            print(f"{n:<16} val_loss {r['val_loss']:.4f}  train_loss {r['train_loss']:.4f}  "
                  f"{r['tokens_per_s']:>10.0f} tokens/s  {r['wall_s']:>5.0f} s")
        else:
            print(f"{n:<16} {r.get('error')}")
    print(f"(tolerance |{ours} - host| <= {args.tolerance})")
    print(f"summary: val_loss after {args.fortune_steps} steps: {losses}{verdict}")
    sys.exit(1 if failed else 3 if partial else 0)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["train", "attention", "fortunes"])
    p.add_argument("--out", required=True, help="the JSON file (OUTDIR/side-by-side.json)")
    p.add_argument("--device", default="cuda:0", help="PyTorch's name (cpu, cuda:N)")
    p.add_argument("--ours", help="bench-train's command (train, attention)")
    p.add_argument("--chorus-train", help="chorus-train's command (fortunes)")
    p.add_argument("--data", help="the fortunes' folder (fortunes)")
    p.add_argument("--budget", type=float, default=300, help="seconds for this step")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=0, help="timed steps a run (default: by case)")
    p.add_argument("--gpt-batch", type=int, default=0)
    p.add_argument("--image-batch", type=int, default=0)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--compile-timeout", type=float, default=240)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--fortune-steps", type=int, default=300)
    p.add_argument("--tolerance", type=float, default=0.02)
    p.add_argument("--tiny", action="store_true", help="the rehearsal's small shapes")
    for k in ("gpu-name", "driver", "cuda-driver", "cuda-toolkit", "source"):
        p.add_argument("--" + k, default=None, help="for the JSON's header")
    args = p.parse_args()
    if args.what in ("train", "attention") and not args.ours:
        p.error(f"{args.what} needs --ours")
    if args.what == "fortunes" and not (args.chorus_train and args.data):
        p.error("fortunes needs --chorus-train and --data")
    {"train": cmd_train, "attention": cmd_attention, "fortunes": cmd_fortunes}[args.what](args)


if __name__ == "__main__":
    main()
