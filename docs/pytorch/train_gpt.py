#!/usr/bin/env python3
"""PyTorch's baseline of `chorus-train --model gpt` on a text read as bytes.

    python3 train_gpt.py --data /usr/share/games/fortunes --layers 4 --heads 4
        --dim 128 --context 64 --batch 32 --max-steps 2000 --lr 1e-3
        --threads 2 --seed 1 [--eval-every K] [--generate N] [--device cpu|cuda:N]

The data: PATH is a file, or a folder whose regular files (not symlinks, not
named *.dat) are concatenated in name order, which picks exactly the texts
of Debian's fortunes package. Tokens are the bytes (vocabulary 256); the
validation split is the last n // 10 bytes, the train split the rest.

A step takes --batch windows of context + 1 tokens at offsets drawn
uniformly from the train split's valid offsets by an RNG of its own (seeded
by --seed); inputs are a window's first context tokens, targets its last.
AdamW (betas 0.9/0.999, eps 1e-8, weight decay 0.01 on every parameter),
constant learning rate, no clipping, dropout 0.

The validation loss is the mean cross-entropy over every token of the
consecutive windows of the validation split: window i starts at i * context
(i < (n_val - 1) // context), as chorus-train computes it.

--device cuda:N trains on that GPU (the model and each batch there; the
windows are drawn on the CPU as above, so the same batches as on the CPU).

At the end one JSON line: val_loss, train_loss (mean over the last 100
steps, or all of them if fewer), tokens_per_s (training tokens over the
training seconds, evaluation excluded), steps, seconds.
"""
import argparse
import json
import os
import sys
import time

import torch
from torch.nn import functional as F

from models import gpt

VOCAB = 256


def read_text(path):
    if not os.path.isdir(path):
        with open(path, "rb") as f:
            return f.read()
    parts = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name.endswith(".dat") or os.path.islink(full) or not os.path.isfile(full):
            continue
        with open(full, "rb") as f:
            parts.append(f.read())
    return b"".join(parts)


def split(data):
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    n_val = len(tokens) // 10
    return tokens[:len(tokens) - n_val], tokens[len(tokens) - n_val:]


def train_batch(train, batch, context, gen, device="cpu"):
    offsets = torch.randint(0, len(train) - context, (batch,), generator=gen)
    windows = torch.stack([train[o:o + context + 1] for o in offsets.tolist()]).to(device)
    return windows[:, :-1], windows[:, 1:]


@torch.no_grad()
def val_loss(model, val, context, batch=64, device="cpu"):
    model.eval()
    count = (len(val) - 1) // context
    total = 0.0
    for start in range(0, count, batch):
        idx = torch.arange(start, min(start + batch, count)) * context
        windows = torch.stack([val[i:i + context + 1] for i in idx.tolist()]).to(device)
        logits = model(windows[:, :-1])
        total += F.cross_entropy(logits.reshape(-1, VOCAB), windows[:, 1:].reshape(-1),
                                 reduction="sum").item()
    model.train()
    return total / (count * context)


@torch.no_grad()
def generate(model, n, context, temperature, top_k, gen, device="cpu"):
    model.eval()
    out = [ord("\n")]
    for _ in range(n):
        idx = torch.tensor([out[-context:]], device=device)
        logits = model(idx)[0, -1].float().cpu() / temperature
        if top_k:
            kth = torch.topk(logits, min(top_k, VOCAB)).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        out.append(int(torch.multinomial(F.softmax(logits, -1), 1, generator=gen)))
    model.train()
    return bytes(out[1:])


def recent(losses):
    """The training loss reported: the mean over the last 100 steps."""
    return sum(losses[-100:]) / len(losses[-100:])


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="a text file, or a folder of them")
    for name, default in (("layers", 4), ("heads", 4), ("dim", 128), ("context", 64),
                          ("batch", 32), ("max-steps", 2000), ("threads", 2), ("seed", 1),
                          ("eval-every", 0), ("generate", 0), ("top-k", 40)):
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    args = p.parse_args()
    if min(args.layers, args.heads, args.dim, args.context, args.batch, args.max_steps,
           args.threads) < 1 or args.eval_every < 0 or args.generate < 0 or args.top_k < 0:
        p.error("sizes, steps and threads must be >= 1; --eval-every, --generate, "
                "--top-k >= 0")
    if args.temperature <= 0:
        p.error("--temperature must be > 0")
    return args


def main():
    args = parse()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"train_gpt: --device {args.device}: torch.cuda.is_available() is False")
    train, val = split(read_text(args.data))
    if len(train) <= args.context or len(val) <= args.context:
        sys.exit(f"train_gpt: {args.data}: {len(train)} train and {len(val)} validation "
                 f"bytes, too few for windows of {args.context + 1}")
    print(f"data: {len(train)} train bytes, {len(val)} validation bytes; PyTorch "
          f"{torch.__version__}, {torch.get_num_threads()} threads, {device}", flush=True)
    torch.manual_seed(args.seed)
    model = gpt(args.layers, args.heads, args.dim, args.context, VOCAB).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)
    losses, seconds = [], 0.0
    for step in range(1, args.max_steps + 1):
        t0 = time.perf_counter()
        x, y = train_batch(train, args.batch, args.context, gen, device)
        loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        seconds += time.perf_counter() - t0
        if step % 100 == 0 or step == args.max_steps:
            rate = step * args.batch * args.context / seconds
            print(f"step {step}/{args.max_steps} train_loss {recent(losses):.4f} "
                  f"tokens/s {rate:.0f}", flush=True)
        if args.eval_every and step % args.eval_every == 0 and step != args.max_steps:
            print(f"step {step} val_loss {val_loss(model, val, args.context, device=device):.4f}",
                  flush=True)
    result = {"val_loss": round(val_loss(model, val, args.context, device=device), 4),
              "train_loss": round(recent(losses), 4),
              "tokens_per_s": round(args.max_steps * args.batch * args.context / seconds, 1),
              "steps": args.max_steps, "seconds": round(seconds, 1)}
    if args.generate:
        text = generate(model, args.generate, args.context, args.temperature, args.top_k,
                        torch.Generator().manual_seed(args.seed), device)
        print(text.decode("utf-8", errors="replace"))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
