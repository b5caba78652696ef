# chorus-train's progress line on terminals of several widths
# (test-train-progress.py); test-train.sh, declared in tests/Makefile.mk,
# runs the rest end to end. idxset.py writes made-up IDX sets for both.
TESTS += tests/test-train-progress.py
EXTRA_DIST += tests/test-train-progress.py tests/idxset.py tests/taplib.py
# Checkpoints under SIGKILL: 200 kills of a training that saves every step
# (CHORUS_CRASH_ITERATIONS, CHORUS_CRASH_SECONDS).
TESTS += tests/test-crash.py
EXTRA_DIST += tests/test-crash.py
# chorus-train over the host and two vendors' OpenCL platforms, step for
# step against the host alone (skips itself with one platform).
TESTS += tests/test-train-vendors.sh
EXTRA_DIST += tests/test-train-vendors.sh
