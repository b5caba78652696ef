#!/usr/bin/env python3
"""bench-memory.sh's picture: each device's peak memory in the four setups
(neither option, --shard-optimizer, --recompute, both), grouped by device,
with the limit of the proof as a line on its device.

    python3 bench/plot-memory.py OUT PICTURE.png [LIMITED LIMIT_BYTES]

OUT is bench-memory.sh's folder (its OUT); matplotlib draws."""
import json
import sys

SETUPS = [("plain", "neither"), ("shard", "--shard-optimizer"), ("recompute", "--recompute"),
          ("both", "both")]


def main():
    if len(sys.argv) not in (3, 5):
        sys.exit(__doc__)
    out, picture = sys.argv[1], sys.argv[2]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot-memory.py: needs matplotlib")
    runs = {name: json.load(open(f"{out}/{name}.1.json")) for name, _ in SETUPS}
    devices = list(runs["plain"]["memory"].keys())
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    width = 0.2
    for k, (name, label) in enumerate(SETUPS):
        peaks = [runs[name]["memory"][d]["peak_bytes"] / 2**20 for d in devices]
        bars = ax.bar([i + (k - 1.5) * width for i in range(len(devices))], peaks, width,
                      label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    if len(sys.argv) == 5 and sys.argv[3] in devices:
        i = devices.index(sys.argv[3])
        limit = int(sys.argv[4]) / 2**20
        ax.hlines(limit, i - 2.2 * width, i + 2.2 * width, colors="black", linestyles="dashed")
        ax.annotate(f"limit\n{limit:.0f} MiB", (i + 2.2 * width, limit), textcoords="offset points",
                    xytext=(3, 0), ha="left", va="center", fontsize=8)
        ax.set_xlim(-0.6, len(devices) - 0.25)
    ax.set_xticks(range(len(devices)))
    ax.set_xticklabels(devices)
    ax.set_ylabel("peak MiB")
    ax.set_title("GPT at GPT-2 small's shape, batch 3 over three devices: peak memory")
    ax.legend(fontsize=8, loc="upper right", framealpha=1.0)
    fig.tight_layout()
    fig.savefig(picture, dpi=110)


if __name__ == "__main__":
    main()
