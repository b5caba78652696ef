#!/usr/bin/env python3
"""Load a chorus-train checkpoint into the matching PyTorch nn.Sequential.

    python3 load_checkpoint.py model.safetensors cnn [DATA_DIR]

The parameters are stored under PyTorch's state_dict names and layouts, so
safetensors.torch.load_file reads them straight into the model; the
optimizer's state ("optimizer.*") and the training state (the header's
metadata) ride along in the same file and are set aside here. With a data
folder (Fashion-MNIST IDX files), the model is evaluated on the test set,
normalised as the metadata says it was trained.
"""
import gzip
import os
import struct
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from models import preset


def idx(path):
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    dims = struct.unpack(">" + "I" * (magic & 0xFF), data[4:4 + 4 * (magic & 0xFF)])
    body = torch.frombuffer(bytearray(data[4 + 4 * len(dims):]), dtype=torch.uint8)
    return body.reshape(dims)


def main():
    path, kind = sys.argv[1], sys.argv[2]
    tensors = load_file(path)
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
    print("training state:", meta)
    # The inputs' normalisation the model was trained with; checkpoints
    # older than that record were all trained with Fashion-MNIST's.
    mean = float(meta.get("input_mean", 0.2860))
    std = float(meta.get("input_std", 0.3530))
    weights = {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}
    net = preset(kind)
    net.load_state_dict(weights, strict=True)
    print("loaded", len(weights), "tensors into", kind)
    if len(sys.argv) > 3:
        d = sys.argv[3]
        name = lambda base: next(os.path.join(d, base + s) for s in (".gz", "")
                                 if os.path.exists(os.path.join(d, base + s)))
        x = idx(name("t10k-images-idx3-ubyte")).float().div(255).sub(mean).div(std)
        y = idx(name("t10k-labels-idx1-ubyte")).long()
        with torch.no_grad():
            acc = (net(x.unsqueeze(1)).argmax(1) == y).float().mean().item()
        print("test accuracy in PyTorch: %.4f" % acc)


if __name__ == "__main__":
    main()
