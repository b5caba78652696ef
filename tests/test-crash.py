#!/usr/bin/env python3
"""Crash safety of checkpoints: chorus-train, writing a checkpoint after
every step (one-step epochs of the mlp on a made-up set of 32 images, so
that writing the 8 MB file is most of each step), is killed with SIGKILL,
again and again, each run resuming from the checkpoint the last one left:
every other kill at a random moment of the run, the others within 5 ms of
the run's k-th save beginning (k from 1 to 6). After every kill the checkpoint is a complete file (its
header parses, its tensors fill the file exactly, every value is finite)
holding the step of the last complete save or a later one, never an older
one; the temporary file a kill may leave behind is never read. Each run
resumes from the file the kill left (a run that fails to resume exits by
itself, which fails the test), and at the end a run resumes and finishes.

CHORUS_CRASH_ITERATIONS (default 200) sets the number of kills and
CHORUS_CRASH_SECONDS (default 900) bounds the time: the test fails if the
kills do not all fit in it."""
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import idxset  # noqa: E402
import taplib  # noqa: E402
from taplib import ok  # noqa: E402

TRAIN = os.environ.get("CHORUS_TRAIN", "./utils/chorus-train")
ITERATIONS = int(os.environ.get("CHORUS_CRASH_ITERATIONS", "200"))
SECONDS = float(os.environ.get("CHORUS_CRASH_SECONDS", "900"))

def check(path):
    """The step of a complete checkpoint, or raise ValueError saying what
    is wrong with it."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("%d bytes, not even a header length" % size)
        (n,) = struct.unpack("<Q", raw)
        if n > size - 8:
            raise ValueError("header of %d bytes in a file of %d" % (n, size))
        header = json.loads(f.read(n))
        end = 0
        spans = []
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            lo, hi = entry["data_offsets"]
            spans.append((lo, hi, name, entry["dtype"]))
            end = max(end, hi)
        if 8 + n + end != size:
            raise ValueError("the tensors end at %d, the file at %d" % (8 + n + end, size))
        spans.sort()
        at = 0
        for lo, hi, name, dtype in spans:
            if lo != at:
                raise ValueError("%s starts at %d, not %d" % (name, lo, at))
            at = hi
            f.seek(8 + n + lo)
            data = f.read(hi - lo)
            if dtype == "F32":
                values = struct.unpack("<%df" % ((hi - lo) // 4), data)
                bad = [v for v in values if not math.isfinite(v)]
                if bad:
                    raise ValueError("%s holds %d values that are not finite" % (name, len(bad)))
        return int(header["__metadata__"]["step"])


def main():
    tmp = tempfile.mkdtemp(prefix="test-crash.")
    data = os.path.join(tmp, "data")
    idxset.write(data, 32, 32)
    ckpt = os.path.join(tmp, "ckpt.st")
    base = [TRAIN, "--data", data, "--devices", "host", "--model", "mlp", "--batch", "32",
            "--epochs", "1000000", "--checkpoint", ckpt, "--quiet"]
    rng = random.Random(int(os.environ.get("CHORUS_CRASH_SEED", "1")))
    start = time.monotonic()
    last_step = -1
    kills = during_write = resumed = 0
    problems = []
    # How long a resumed run of ten steps takes, start included.
    def timed(steps):
        t0 = time.monotonic()
        args = base + ["--max-steps", str(steps)]
        if os.path.exists(ckpt):
            args += ["--resume", ckpt]
        p = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        took = time.monotonic() - t0
        got = -1
        try:
            got = check(ckpt)
        except (ValueError, KeyError, OSError, json.JSONDecodeError):
            pass
        return p.returncode == 0 and got == steps, took, p.stderr[-200:]
    good3, _, err3 = timed(3)
    good13, run10, err13 = timed(13)
    os.unlink(ckpt)
    if not ok(good3 and good13, "a run of 3 steps, then one resumed to 13, write their "
              "checkpoints (the second in %.2f s; %s%s)" % (run10, err3, err13)):
        return 1
    for i in range(ITERATIONS):
        if time.monotonic() - start > SECONDS:
            problems.append("out of time after %d kills" % i)
            break
        args = list(base)
        if os.path.exists(ckpt):
            args += ["--resume", ckpt]
        started = time.time()
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if i % 2 == 0:
            # At any moment: starting, training, evaluating or saving.
            time.sleep(rng.uniform(0.3 * run10, 1.3 * run10))
        else:
            # Inside a save: once the run's k-th temporary file appears
            # (a new one each save), within the next 5 ms.
            k, seen, last = rng.randint(1, 6), 0, None
            deadline = time.monotonic() + 3 * run10 + 5
            while time.monotonic() < deadline and p.poll() is None:
                try:
                    st = os.stat(ckpt + ".tmp")
                    if st.st_mtime >= started and st.st_ino != last:
                        seen, last = seen + 1, st.st_ino
                        if seen >= k:
                            time.sleep(rng.uniform(0, 0.005))
                            break
                except FileNotFoundError:
                    pass
                time.sleep(0.0005)
        if p.poll() is not None:
            _, err = p.communicate()
            problems.append("run %d ended by itself (exit %d): %s" %
                            (i, p.returncode, err.decode(errors="replace")[-300:]))
            break
        p.kill()
        p.communicate()
        kills += 1
        # A temporary file this run was writing (not one an earlier kill
        # left): the kill fell in a write.
        try:
            if os.stat(ckpt + ".tmp").st_mtime >= started:
                during_write += 1
        except FileNotFoundError:
            pass
        if not os.path.exists(ckpt):
            if last_step >= 0:
                problems.append("kill %d: the checkpoint is gone" % i)
                break
            continue
        try:
            step = check(ckpt)
        except (ValueError, KeyError, json.JSONDecodeError) as e:
            problems.append("kill %d: the checkpoint is torn: %s" % (i, e))
            shutil.copy(ckpt, ckpt + ".torn")
            break
        if step < last_step:
            problems.append("kill %d: the checkpoint went back from step %d to %d" %
                            (i, last_step, step))
            break
        if last_step >= 0:
            resumed += 1
        last_step = step
    elapsed = time.monotonic() - start
    ok(not problems and kills == ITERATIONS,
       "%d kills with SIGKILL in %.0f s, %d of them during a checkpoint write; the "
       "checkpoint was complete after every one, its step never went back (last %d), %d runs "
       "resumed from what a kill left%s" %
       (kills, elapsed, during_write, last_step, resumed,
        "" if not problems else ": " + "; ".join(problems)))
    ok(during_write >= kills // 4, "at least a quarter of the kills fell in a write (%d of %d "
       "left the .tmp file the run was writing)" % (during_write, kills))
    # The last checkpoint resumes to the end of a run.
    r = subprocess.run(base + ["--resume", ckpt, "--max-steps", str(last_step + 2)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    final = -1
    try:
        final = check(ckpt)
    except (ValueError, KeyError, OSError, json.JSONDecodeError):
        pass
    ok(r.returncode == 0 and final == last_step + 2 and b"result test_accuracy=" in r.stdout,
       "the last checkpoint (step %d) resumes and trains on to step %d (exit %d, got step %d: "
       "%s)" % (last_step, last_step + 2, r.returncode, final,
                (r.stdout + r.stderr).decode(errors="replace")[-200:].strip()))
    if not taplib.failed:
        shutil.rmtree(tmp)
    else:
        print("# files kept in %s" % tmp)
    return taplib.done()


if __name__ == "__main__":
    sys.exit(main())
