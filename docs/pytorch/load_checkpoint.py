#!/usr/bin/env python3
"""Load a chorus-train checkpoint into the matching PyTorch model.

    python3 load_checkpoint.py model.safetensors mlp|cnn|resnet [FASHION_MNIST_DIR]
    python3 load_checkpoint.py model.safetensors gpt [TEXT]
        [--depth N --width N --in-channels N --classes N]
        [--layers N --heads N --dim N --context N --vocab N]

The parameters and buffers are stored under PyTorch's state_dict names and
layouts; the optimizer's state ("optimizer.*") and the training state (the
header's metadata) ride along in the same file and are set aside here. The
rest is loaded by name with safetensors.torch.load_model(strict=True)'s
rules: no missing and no unexpected name, the GPT's tied output weight
given once as transformer.wte.weight. The resnet's and gpt's configuration
comes from the checkpoint's metadata (keys named as the options above),
else from the options.

With a data folder (Fashion-MNIST IDX files), an image model is evaluated
on the test set in evaluation mode (the resnet on its running statistics),
normalised as the metadata says it was trained. With a text (a file or a
folder, read as train_gpt.py reads it), the gpt's validation loss is
computed as train_gpt.py and chorus-train compute it.
"""
import argparse
import gzip
import os
import struct

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from models import load_state, preset
from train_gpt import read_text, split, val_loss

CONFIG = {"resnet": {"depth": 20, "width": 16, "in_channels": 1, "classes": 10},
          "gpt": {"layers": 4, "heads": 4, "dim": 128, "context": 64, "vocab": 256}}


def idx(path):
    with open(path, "rb") as f:
        opener = gzip.open if f.read(2) == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    dims = struct.unpack(">" + "I" * (magic & 0xFF), data[4:4 + 4 * (magic & 0xFF)])
    body = torch.frombuffer(bytearray(data[4 + 4 * len(dims):]), dtype=torch.uint8)
    return body.reshape(dims)


def model_config(kind, meta, options):
    """The checkpoint's metadata first, then the options."""
    return {k: int(meta.get(k, options.get(k))) for k in CONFIG.get(kind, {})}


def load(path, kind, options):
    """The model of `kind` holding the checkpoint at `path`, in evaluation
    mode, and the checkpoint's metadata."""
    tensors = load_file(path)
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
    weights = {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}
    model = preset(kind, **model_config(kind, meta, options))
    load_state(model, weights)
    model.eval()
    return model, meta, len(weights)


@torch.no_grad()
def test_accuracy(model, folder, mean, std, batch=500):
    def name(base):
        return next(os.path.join(folder, base + s) for s in (".gz", "")
                    if os.path.exists(os.path.join(folder, base + s)))
    x = idx(name("t10k-images-idx3-ubyte")).float().div(255).sub(mean).div(std).unsqueeze(1)
    y = idx(name("t10k-labels-idx1-ubyte")).long()
    correct = sum((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
                  for i in range(0, len(y), batch))
    return correct / len(y)


def text_val_loss(model, text):
    _, val = split(read_text(text))
    return val_loss(model, val, model.context)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("kind", choices=["mlp", "cnn", "resnet", "gpt"])
    p.add_argument("data", nargs="?", help="Fashion-MNIST folder, or the gpt's text")
    for kind in CONFIG:
        for k, default in CONFIG[kind].items():
            p.add_argument("--" + k.replace("_", "-"), type=int, default=default,
                           help=f"{kind} (when the metadata has none; default {default})")
    args = p.parse_args()
    model, meta, count = load(args.checkpoint, args.kind, vars(args))
    print("training state:", meta)
    print("loaded", count, "tensors into", args.kind)
    if args.data is None:
        return
    if args.kind == "gpt":
        print("validation loss in PyTorch: %.4f" % text_val_loss(model, args.data))
        return
    # The inputs' normalisation the model was trained with; checkpoints
    # older than that record were all trained with Fashion-MNIST's.
    mean = float(meta.get("input_mean", 0.2860))
    std = float(meta.get("input_std", 0.3530))
    print("test accuracy in PyTorch: %.4f" % test_accuracy(model, args.data, mean, std))


if __name__ == "__main__":
    main()
