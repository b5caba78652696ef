# chorus-train's progress line on terminals of several widths
# (test-train-progress.py); test-train.sh, declared in tests/Makefile.mk,
# runs the rest end to end. idxset.py writes made-up IDX sets for both.
TESTS += tests/test-train-progress.py
EXTRA_DIST += tests/test-train-progress.py tests/idxset.py
