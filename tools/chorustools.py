"""What the tools of this folder share: reading a trace, failing with one
line instead of a traceback, and finding matplotlib. Standard library only.

Exit statuses: 2 for a bad command line, 1 for a file that cannot be read
or written (or a missing matplotlib)."""
import json
import os
import sys

USAGE = 2
BAD_FILE = 1


class Failure(Exception):
    """A user's error: `message` is printed on one line, `status` is the
    exit status."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def run(main):
    """Call main() and turn a Failure (or an interrupt, or a closed pipe)
    into one line on stderr and its exit status."""
    prog = os.path.basename(sys.argv[0])
    try:
        sys.exit(main())
    except Failure as f:
        print("%s: %s" % (prog, f), file=sys.stderr)
        sys.exit(f.status)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(1)


def read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise Failure(BAD_FILE, "cannot read %s: %s" % (path, e.strerror or e))
    except UnicodeDecodeError as e:
        raise Failure(BAD_FILE, "%s is not UTF-8 text (byte %d)" % (path, e.start))


def _close_cut_trace(text):
    """The events of a trace whose writer never closed it (a program that
    ended before ch_trace_stop): the recorder writes whole events separated
    by ",\\n", so the text up to the last complete one, closed, parses.
    None when that does not work either."""
    head = text.lstrip()
    if head.startswith("["):
        closing = "]"
    elif head.startswith("{") and '"traceEvents"' in head[:64]:
        closing = "]}"
    else:
        return None
    end = len(text)
    for _ in range(64):
        end = text.rfind("}", 0, end)
        if end < 0:
            return None
        try:
            return json.loads(text[: end + 1] + closing)
        except ValueError:
            continue
    return None


def load_trace(path):
    """The list of events of a Chrome trace-event file: an object with
    "traceEvents", or a bare array. Returns (events, the top-level object,
    or {} for an array). A trace cut short is read up to its last whole
    event, with a warning."""
    text = read_text(path)
    try:
        data = json.loads(text)
    except ValueError as e:
        data = _close_cut_trace(text)
        if data is None:
            raise Failure(BAD_FILE, "%s is not JSON: %s" % (path, e))
        print(
            "%s: warning: %s is not closed (its program stopped before the trace did); "
            "reading the events before the cut" % (os.path.basename(sys.argv[0]), path),
            file=sys.stderr,
        )
    if isinstance(data, list):
        top, events = {}, data
    elif isinstance(data, dict) and isinstance(data.get("traceEvents"), list):
        top, events = data, data["traceEvents"]
    else:
        raise Failure(
            BAD_FILE,
            '%s is not a trace: want an object with a "traceEvents" array, or an array' % path,
        )
    bad = sum(1 for e in events if not isinstance(e, dict))
    if bad:
        raise Failure(BAD_FILE, "%s: %d of its events are not JSON objects" % (path, bad))
    return events, top


def matplotlib_pyplot():
    """matplotlib's pyplot on a backend that needs no display, or a Failure
    saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise Failure(
            BAD_FILE,
            "needs matplotlib: pip install matplotlib (Debian: apt-get install python3-matplotlib)",
        )
    return plt


def save_figure(fig, path):
    """Write the picture, in the format its name's extension says (.png,
    .svg, .pdf)."""
    try:
        fig.savefig(path)
    except OSError as e:
        raise Failure(BAD_FILE, "cannot write %s: %s" % (path, e.strerror or e))
    except ValueError as e:
        raise Failure(USAGE, "cannot write %s: %s" % (path, e))
