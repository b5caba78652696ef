#!/usr/bin/env python3
"""chorus-train's progress line on a terminal (a pseudo-terminal of a given
size): no line it draws is wider than the terminal, and every update
redraws the line in place (a carriage return, no newline between updates
of an epoch). The width comes from the terminal, else $COLUMNS, else 80."""
import fcntl
import os
import struct
import subprocess
import sys
import tempfile
import termios
import tty

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import idxset  # noqa: E402
from taplib import done, ok, skip  # noqa: E402

TRAIN = os.environ.get("CHORUS_TRAIN", "./utils/chorus-train")
EPOCHS = 2
BATCHES = 30  # 600 samples in batches of 20


def run(data, devices, cols, columns_env=None):
    """chorus-train with stderr on a terminal `cols` wide (0: a terminal
    that reports no size); returns its exit status and the bytes drawn."""
    master, slave = os.openpty()
    tty.setraw(slave)  # no output processing: the bytes exactly as written
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
    env = dict(os.environ)
    env.pop("COLUMNS", None)
    if columns_env:
        env["COLUMNS"] = columns_env
    args = [TRAIN, "--data", data, "--devices", devices, "--model", "mlp", "--batch", "20",
            "--epochs", str(EPOCHS), "--split", "equal"]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=slave, env=env)
    os.close(slave)
    drawn = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal's last writer has gone
            break
        if not chunk:
            break
        drawn += chunk
    os.close(master)
    return proc.wait(), drawn


def widest(drawn):
    """The widest line on the screen: a carriage return or a newline sends
    the cursor back to the first column."""
    top = col = 0
    for ch in drawn.decode("utf-8", "replace"):
        col = 0 if ch in "\r\n" else col + 1
        top = max(top, col)
    return top


def in_place(drawn, notes):
    """`notes` whole lines, then per epoch at least one update per batch,
    each starting with a carriage return, and one newline at its end."""
    lines = drawn.split(b"\n")
    epochs = lines[notes:-1]
    return (lines[-1] == b"" and len(epochs) == EPOCHS and
            all(e.startswith(b"\r") and e.count(b"\r") >= BATCHES for e in epochs))


def last_update(drawn):
    return drawn.split(b"\n")[-2].split(b"\r")[-1].decode("utf-8", "replace").rstrip()


def check(data, devices, cols, notes, columns_env=None, width=None, keeps=(), fills=True):
    """One run: the line fits `width` columns (the terminal's by default),
    and fills it but for a few when `fills` (the full line is wider)."""
    width = width or cols
    size = "COLUMNS=%s" % columns_env if columns_env else "no COLUMNS"
    where = "%s on %s" % (devices, "a terminal %d wide" % cols if cols else
                          "a terminal of no size, " + size)
    status, drawn = run(data, devices, cols, columns_env)
    if status != 0:
        ok(False, "%s: exit status %d: %r" % (where, status, drawn[-300:]))
        return ""
    # The run's breakdown and the devices' memory end it: one line each,
    # printed once (the terminal wraps them; only the progress line has to
    # fit, being redrawn).
    cut = drawn.rfind(b"\nbreakdown: ")
    summary = drawn[cut + 1:].decode("utf-8", "replace") if cut >= 0 else ""
    parts = summary.split("\n")
    ok(summary.endswith("\n") and len(parts) == 3 and "\r" not in summary and
       "% of the step is reduction not hidden by backward" in parts[0] and
       parts[1].startswith("memory: host peak "),
       "%s: the breakdown and the memory end it, a line each: %r" % (where, summary))
    if cut >= 0:
        drawn = drawn[:cut + 1]
    top = widest(drawn)
    line = last_update(drawn)
    least = width - 12 if fills else 1
    ok(least <= top <= width, "%s: the widest line takes %d columns, want %d to %d (last: %r)" %
       (where, top, least, width, line))
    ok(in_place(drawn, notes), "%s: %d updates redrawn in place, one newline an epoch: %r" %
       (where, drawn.count(b"\r"), drawn[:200]))
    missing = [k for k in keeps if k not in line]
    if keeps:
        ok(not missing, "%s: the line keeps %s (missing %s): %r" % (where, keeps, missing, line))
    return line


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "idx")
        idxset.write(data, 600, 100)
        # Two replicas on the host: the line with every part is about 130
        # columns, so 80 must drop some.
        check(data, "host,host", 80, 1, keeps=("epoch 2/2", "[", "loss", "left"))
        check(data, "host,host", 40, 1, keeps=("epoch 2/2", "loss"))
        check(data, "host", 80, 0, keeps=("epoch 2/2", "[", "loss", "left"))
        wide = check(data, "host,host", 200, 1, keeps=("step", "samples/s"), fills=False)
        ok("| host#1 10 " in wide and "| host#2 10 " in wide,
           "on 200 columns every replica shows, numbered on their shared device: %r" % wide)
        check(data, "host,host", 0, 1, columns_env="50", width=50)
        check(data, "host,host", 0, 1, width=80)
        status, drawn = run(data, "host,opencl:0", 80)
        if status == 2 and b"opencl:0" in drawn:
            for _ in range(3):
                skip("no opencl:0 here: %r" % drawn.strip()[:120])
        else:
            check(data, "host,opencl:0", 80, 0, keeps=("epoch 2/2", "loss"))
    return done()


if __name__ == "__main__":
    sys.exit(main())
