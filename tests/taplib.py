"""TAP for the Python tests: ok() and skip() print a line each, done()
prints the plan and gives the exit status."""
import sys

count = 0
failed = False


def ok(cond, what):
    global count, failed
    count += 1
    print("%sok %d - %s" % ("" if cond else "not ", count, what.replace("#", "_")))
    sys.stdout.flush()
    failed |= not cond
    return cond


def skip(what):
    global count
    count += 1
    print("ok %d # SKIP %s" % (count, what))


def done():
    print("1..%d" % count)
    return 1 if failed else 0
