#!/usr/bin/env python3
"""Write the PyTorch fixtures of the resnet and gpt equivalence tests.

    python3 make_fixtures.py [OUTDIR]      (default: tests/fixtures)

For a tiny GPT and a tiny ResNet (models.py), one training step in float32
on one thread, from a fixed seed, saved as safetensors with these tensors
("<name>" is a state_dict name; the GPT's tied lm_head.weight appears only
as transformer.wte.weight):

  param/<name>         every parameter before the step
  buffer/<name>        every buffer before the step (num_batches_tracked:
                       int64, 0-d, as in PyTorch's state_dict)
  input                resnet f32 [N, 1, 12, 12]; gpt int32 [B, T]
  target               int32 [N] or [B, T]
  logits               training mode, f32 [N, classes] or [B*T, vocab]
  loss                 f32 [1], mean cross-entropy over N or B*T
  grad/<name>          every parameter's gradient after loss.backward()
                       (wte's is the sum of its two uses)
  buffer_after/<name>  every buffer after that training-mode forward
  step/<name>          every parameter after one torch.optim.AdamW step
                       over all parameters
  eval_logits          evaluation mode after the step, same input (the
                       resnet uses its running statistics)

and the configuration, optimizer settings and PyTorch version as string
metadata. The same PyTorch version writes the same tensors (the metadata's
order in the header may differ).
"""
import os
import sys

import torch
from safetensors.torch import save_file
from torch.nn import functional as F

from models import gpt, resnet

SEED = 1234
ADAMW = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
BN_MOMENTUM, BN_EPS, LN_EPS = 0.1, 1e-5, 1e-5
GPT = {"layers": 2, "heads": 2, "dim": 32, "context": 16, "vocab": 64, "dropout": 0.0}
GPT_BATCH = 3
RESNET = {"depth": 8, "width": 4, "in_channels": 1, "classes": 10}
RESNET_BATCH, IMAGE_SIZE = 6, 12


def snapshot(prefix, named):
    return {prefix + name: t.detach().clone().contiguous() for name, t in named}


def one_step(model, x, target, flat_logits):
    """The fixture tensors of one forward, backward and AdamW step."""
    params = list(model.named_parameters())
    out = snapshot("param/", params)
    out.update(snapshot("buffer/", model.named_buffers()))
    model.train()
    logits = flat_logits(model(x))
    loss = F.cross_entropy(logits, target.reshape(-1).long())
    loss.backward()
    out["logits"] = logits.detach().clone()
    out["loss"] = loss.detach().reshape(1).clone()
    out.update(snapshot("grad/", ((n, p.grad) for n, p in params)))
    out.update(snapshot("buffer_after/", model.named_buffers()))
    opt = torch.optim.AdamW(model.parameters(), foreach=False, **ADAMW)
    opt.step()
    out.update(snapshot("step/", params))
    model.eval()
    with torch.no_grad():
        out["eval_logits"] = flat_logits(model(x)).clone()
    return out


def metadata(kind, config, batch, **extra):
    meta = {"model": kind, "batch": batch, "seed": SEED, "lr": ADAMW["lr"],
            "beta1": ADAMW["betas"][0], "beta2": ADAMW["betas"][1], "eps": ADAMW["eps"],
            "weight_decay": ADAMW["weight_decay"], "bn_momentum": BN_MOMENTUM,
            "bn_eps": BN_EPS, "ln_eps": LN_EPS, "torch_version": torch.__version__,
            **config, **extra}
    return {k: str(v) for k, v in meta.items()}


def gpt_fixture():
    torch.manual_seed(SEED)
    model = gpt(**GPT)
    windows = torch.randint(0, GPT["vocab"], (GPT_BATCH, GPT["context"] + 1))
    x, target = windows[:, :-1], windows[:, 1:]
    out = one_step(model, x, target, lambda y: y.reshape(-1, GPT["vocab"]))
    out["input"] = x.to(torch.int32).contiguous()
    out["target"] = target.to(torch.int32).contiguous()
    return out, metadata("gpt", GPT, GPT_BATCH)


def resnet_fixture():
    torch.manual_seed(SEED)
    model = resnet(**RESNET)
    x = torch.randn(RESNET_BATCH, RESNET["in_channels"], IMAGE_SIZE, IMAGE_SIZE)
    target = torch.randint(0, RESNET["classes"], (RESNET_BATCH,))
    out = one_step(model, x, target, lambda y: y)
    out["input"] = x.clone()
    out["target"] = target.to(torch.int32)
    return out, metadata("resnet", RESNET, RESNET_BATCH, image_size=IMAGE_SIZE)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.normpath(
        os.path.join(here, "..", "..", "tests", "fixtures"))
    os.makedirs(outdir, exist_ok=True)
    torch.set_num_threads(1)
    for name, make in (("gpt-tiny", gpt_fixture), ("resnet-tiny", resnet_fixture)):
        tensors, meta = make()
        path = os.path.join(outdir, name + ".safetensors")
        save_file(tensors, path, metadata=meta)
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        nparams = sum(t.numel() for k, t in tensors.items() if k.startswith("param/"))
        print(f"{path}: {len(tensors)} tensors, {nparams} parameters, {nbytes} bytes of "
              f"data, file {os.path.getsize(path)} bytes, loss {tensors['loss'].item():.6f}")


if __name__ == "__main__":
    main()
