# TAP tests under Automake's harness. The backend modules are found in the
# build tree through CHORUS_BACKEND_PATH.
LOG_DRIVER = env AM_TAP_AWK='$(AWK)' $(SHELL) $(top_srcdir)/build-aux/tap-driver.sh
AM_TESTS_ENVIRONMENT = \
	CHORUS_BACKEND_PATH='$(abs_top_builddir)/backends/opencl/.libs:$(abs_top_builddir)/backends/cuda/.libs'; \
	POCL_DEVICES="$${POCL_DEVICES-pthread pthread}"; \
	export CHORUS_BACKEND_PATH POCL_DEVICES;

noinst_HEADERS += tests/tap.h
check_LTLIBRARIES = tests/libtestutil.la
tests_libtestutil_la_SOURCES = tests/tap.c tests/tap.h
tests_libtestutil_la_LIBADD = libchorus.la

TEST_LIBS = tests/libtestutil.la libchorus.la -lm

check_PROGRAMS += tests/test-core
tests_test_core_SOURCES = tests/test-core.c
tests_test_core_LDADD = $(TEST_LIBS)

check_PROGRAMS += tests/test-clock
tests_test_clock_SOURCES = tests/test-clock.c
tests_test_clock_LDADD = $(TEST_LIBS)

check_PROGRAMS += tests/test-nn
tests_test_nn_SOURCES = tests/test-nn.c
tests_test_nn_LDADD = $(TEST_LIBS)

check_PROGRAMS += tests/test-dp
tests_test_dp_SOURCES = tests/test-dp.c
tests_test_dp_LDADD = $(TEST_LIBS)

TESTS += $(check_PROGRAMS) tests/test-train.sh
EXTRA_DIST += tests/test-train.sh
AM_TESTS_ENVIRONMENT += CHORUS_TRAIN='$(abs_top_builddir)/utils/chorus-train'; export CHORUS_TRAIN;
include tests/host.mk
include tests/opencl.mk
include tests/ops.mk
include tests/discovery.mk
include tests/cuda.mk
include tests/nn.mk
include tests/reduce.mk
include tests/train.mk
