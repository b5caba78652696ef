# chorus-train end to end: training, resume, the log and exit codes
# (test-train.sh); its progress line on terminals of several widths
# (test-train-progress.py). idxset.py writes made-up IDX sets for both.
TESTS += tests/test-train.sh tests/test-train-progress.py
EXTRA_DIST += tests/test-train.sh tests/test-train-progress.py tests/idxset.py
AM_TESTS_ENVIRONMENT += CHORUS_TRAIN='$(abs_top_builddir)/utils/chorus-train'; export CHORUS_TRAIN;
