# Python scripts for traces and training logs: shipped in the tarball, not
# installed, run from the source tree (tests/test-tools.sh runs them).
EXTRA_DIST += tools/chorus-trace-plot tools/chorus-log-plot tools/chorus-trace-merge \
	tools/chorustools.py
