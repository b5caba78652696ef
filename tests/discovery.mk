# Tests of the discovery area: made-up machines as hwloc XML topologies, and
# the chorus-info utility.
check_PROGRAMS += tests/test-discovery
tests_test_discovery_SOURCES = tests/test-discovery.c
tests_test_discovery_LDADD = $(INTERNAL_LIBS)

TESTS += tests/test-info.sh

# test-discovery finds the XML files in the source tree (distcheck builds
# elsewhere); test-info.sh runs the chorus-info of this build.
AM_TESTS_ENVIRONMENT += \
	CHORUS_TEST_SRCDIR='$(abs_top_srcdir)'; export CHORUS_TEST_SRCDIR; \
	CHORUS_INFO='$(abs_top_builddir)/utils/chorus-info'; export CHORUS_INFO;

EXTRA_DIST += tests/topologies tests/test-info.sh
