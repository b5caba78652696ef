#!/usr/bin/env python3
"""Writes the seed inputs of tests/fuzz/corpus/ (idx, tokens, devices,
train-options): small valid files in each harness's input layout (see the
comment at the top of each tests/fuzz/fuzz-NAME.c), and a few invalid ones.
The safetensors seeds are checkpoints the harness itself writes:
FUZZ_WRITE_SEEDS=DIR tests/fuzz/fuzz-safetensors /dev/null.
Usage: tests/fuzz/seeds.py [CORPUS_DIR] (default: tests/fuzz/corpus)."""
import gzip
import os
import struct
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")


def put(name, data):
    d = os.path.join(root, os.path.dirname(name))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(root, name), "wb") as f:
        f.write(data)


def gz(data):
    return gzip.compress(data, mtime=0)


# ---- idx: [flags][images length, 2 bytes LE][images][labels] -------------
def images(n, rows, cols):
    body = bytes((i * 31 + k * 7) % 256 for i in range(n) for k in range(rows * cols))
    return struct.pack(">IIII", 0x803, n, rows, cols) + body


def labels(n, classes):
    return struct.pack(">II", 0x801, n) + bytes((i * 7 + 3) % classes for i in range(n))


def idx(flags, img, lab):
    return bytes([flags]) + struct.pack("<H", len(img)) + img + lab


put("idx/seed-plain", idx(1, images(3, 4, 4), labels(3, 10)))
put("idx/seed-harness-gzip", idx(1 | 4 | 8 | 0x10, images(5, 3, 2), labels(5, 10)))
put("idx/seed-gzip-files", idx(0, gz(images(4, 2, 3)), gz(labels(4, 7))))
put("idx/seed-256-classes", idx(2 | 0x30, images(2, 1, 1), labels(2, 256)))
put("idx/seed-one-pixel", idx(3, images(1, 1, 1), labels(1, 2)))
put("idx/seed-swapped", idx(1, labels(3, 10), images(3, 2, 2)))
put("idx/seed-truncated", idx(1, images(3, 4, 4)[:-5], labels(3, 10)))
put("idx/seed-count-mismatch", idx(0, images(3, 2, 2), labels(4, 10)))

# ---- tokens: [mode][...] ---------------------------------------------------
TEXT = b"To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"


def ctx(c):
    return (c - 1) << 1


def rec(n, data, delta=None):
    out = bytes([n]) + struct.pack("<H", len(data))
    if delta is not None:
        out += struct.pack("<b", delta)
    return out + data


def toks(*v):
    return b"".join(struct.pack("<H", t) for t in v)


def shard(tokens):
    return struct.pack("<iii", 20240520, 1, len(tokens) // 2) + bytes(1012) + tokens


put("tokens/seed-text", bytes([ctx(8)]) + TEXT)
put("tokens/seed-text-short", bytes([ctx(1)]) + b"abcdefghij")
put("tokens/seed-texts-folder", bytes([1 | ctx(5)]) + rec(4, TEXT[:40]) + rec(5, TEXT[40:]) +
    rec(11, b"readme\n") + rec(6, b"skipped .dat") + rec(7, b"hidden"))
put("tokens/seed-shards", bytes([1 | ctx(3)]) + rec(0x80 | 0, toks(1, 2, 3, 4, 5, 6, 7, 8)) +
    rec(0x80 | 1, toks(9, 10, 65535)) + rec(0x80 | 10, b"") + rec(0x80 | 2, toks(4, 3, 2, 1, 0)) +
    rec(11, b"not a shard\n"))
put("tokens/seed-shards-raw", bytes([1 | ctx(2)]) + rec(9, shard(toks(*range(20)))) +
    rec(12, shard(toks(*range(100, 110)))))
put("tokens/seed-shard-count", bytes([1]) + rec(0xc0 | 0, toks(1, 2, 3), -1) +
    rec(0x80 | 3, toks(5, 6)))
put("tokens/seed-shard-both", bytes([1]) + rec(0x80 | 8, toks(1, 2)) + rec(0x80 | 2, toks(3)))
put("tokens/seed-shard-folder", bytes([1]) + rec(15, b"") + rec(0x80 | 2, toks(3, 4)))

# ---- devices: [byte 0][list] -----------------------------------------------
for name, b0, lst in [("host", 1, b"host"), ("all", 1, b"all"), ("twice", 9, b"host,host"),
                      ("all-twice", 17, b"all,all,host"), ("empty-name", 1, b"host,,all"),
                      ("unknown", 1, b"cuda:0"), ("capacity", 1, b"host,all"),
                      ("env-host", 0, b"host"), ("env-all", 0, b"all"), ("env-only-commas", 0, b",,"),
                      ("env-unknown", 0, b"host,opencl:7"), ("env-trailing", 0, b"host,"),
                      ("env-too-long", 0, b"host," * 210), ("long", 1, b"host," * 210)]:
    # The two CHORUS_DEVICES lists ch_init once took silently (bugs the
    # harness found) are regressions.
    kind = "regress" if name in ("env-only-commas", "env-too-long") else "seed"
    put("devices/%s-%s" % (kind, name), bytes([b0]) + lst)

# ---- train-options: NUL-separated arguments ------------------------------
for name, args in [
        ("quick", ["--data", "/x", "--devices", "host", "--model", "mlp", "--limit", "2000",
                   "--batch", "50", "--quiet", "--epochs", "2", "--checkpoint", "c.st"]),
        ("resnet", ["--model", "resnet", "--depth", "20", "--augment", "flip,crop:4",
                    "--normalize", "0.2860,0.3530", "--precision", "fp16", "--save-dtype", "bf16"]),
        ("gpt", ["--model", "gpt", "--data", "t.txt", "--layers", "2", "--heads", "4", "--dim",
                 "64", "--context", "32", "--vocab", "300", "--dropout", "0.1", "--generate",
                 "10", "--temperature", "0.8", "--top-k", "5", "--prompt", "hi", "--eval-every",
                 "3"]),
        ("dp", ["--devices", "host,host", "--split", "1,2.5", "--reduce", "host", "--bucket-mb",
                "4", "--accumulate", "2", "--reduce-dtype", "bf16", "--batchnorm", "local",
                "--optimizer", "sgd", "--lr", "0.1", "--weight-decay", "0.01", "--schedule",
                "step", "--seed", "7", "--max-steps", "9", "--log", "l", "--json", "--resume",
                "r.st"]),
        ("equals", ["--model=cnn", "--epochs=3", "--split=equal"]),
        ("memory", ["--devices", "host,opencl:0", "--device-memory", "host=6G,opencl:0=1.5g",
                    "--shard-optimizer", "--recompute"]),
        ("bad-memory", ["--device-memory", "host=1G,host=2K"]),
        ("elastic", ["--devices", "host,opencl:0,opencl:1", "--elastic", "--elastic-timeout",
                     "0.5", "--log", "l", "--json"]),
        ("bad-elastic", ["--elastic", "--shard-optimizer", "--accumulate", "2",
                         "--elastic-timeout", "0"]),
        ("bucket-auto", ["--bucket-mb", "auto", "--trace", "t.json"]),
        ("help", ["--help", "--bogus"]),
        ("version", ["--version"]),
        ("bad-heads", ["--model", "gpt", "--data", "t", "--heads", "3", "--dim", "16"]),
        ("bad-unknown", ["-x", "--nope"]),
        ("bad-missing", ["--epochs"]),
        ("bad-extra", ["stray"]),
]:
    put("train-options/seed-" + name, b"\0".join(a.encode() for a in args))
