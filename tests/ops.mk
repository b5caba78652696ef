# Tests of the ops area: every op on every device against double-precision
# references (ref.c, shared through the test utility library), finite
# differences of every backward op, and bad arguments to every public call.
tests_libtestutil_la_SOURCES += tests/ref.c tests/ref.h

check_PROGRAMS += tests/test-ops tests/test-ops-grad tests/test-ops-attn tests/test-errors
tests_test_ops_SOURCES = tests/test-ops.c
tests_test_ops_LDADD = $(TEST_INTERNAL_LIBS)
tests_test_ops_grad_SOURCES = tests/test-ops-grad.c
tests_test_ops_grad_LDADD = $(TEST_LIBS)
tests_test_ops_attn_SOURCES = tests/test-ops-attn.c
tests_test_ops_attn_LDADD = $(TEST_LIBS)
# The batched GEMM through our own OpenCL kernel too, where CLBlast would
# otherwise take every shape.
EXTRA_DIST += tests/ops-attn-gemm-own.sh
if HAVE_CLBLAST
TESTS += tests/ops-attn-gemm-own.sh
endif
tests_test_errors_SOURCES = tests/test-errors.c
tests_test_errors_LDADD = $(TEST_LIBS) $(PTHREAD_LIBS)

# The normalisation ops (LayerNorm, BatchNorm's steps) on every device.
check_PROGRAMS += tests/test-ops-norm
tests_test_ops_norm_SOURCES = tests/test-ops-norm.c
tests_test_ops_norm_LDADD = $(TEST_LIBS)

# What crosses the backend ABI: test-abi calls the slots of every backend
# directly (the host's from the two sources that hold them and the bf16
# rounding elementwise.c calls, compiled in here), and loads a module built for the previous ABI version, and one that
# leaves a required slot NULL, under the names of real ones.
check_PROGRAMS += tests/test-abi
tests_test_abi_SOURCES = tests/test-abi.c backends/host/elementwise.c backends/host/sum.c \
	backends/host/bf16_round.c
tests_test_abi_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/backends/host
tests_test_abi_LDFLAGS = $(AM_LDFLAGS) $(OPENMP_CFLAGS)
tests_test_abi_LDADD = $(TEST_LIBS)

check_LTLIBRARIES += tests/wrong-abi/chorus-cuda.la
tests_wrong_abi_chorus_cuda_la_SOURCES = tests/wrong-abi-module.c
tests_wrong_abi_chorus_cuda_la_LDFLAGS = $(AM_LDFLAGS) -module -avoid-version -shared \
	-rpath $(abs_builddir)/tests/wrong-abi
check_LTLIBRARIES += tests/missing-slot/chorus-opencl.la
tests_missing_slot_chorus_opencl_la_SOURCES = tests/missing-slot-module.c
tests_missing_slot_chorus_opencl_la_LDFLAGS = $(AM_LDFLAGS) -module -avoid-version -shared \
	-rpath $(abs_builddir)/tests/missing-slot
check_LTLIBRARIES += tests/partial-conv/chorus-opencl.la
tests_partial_conv_chorus_opencl_la_SOURCES = tests/missing-slot-module.c
tests_partial_conv_chorus_opencl_la_CPPFLAGS = $(AM_CPPFLAGS) -DPARTIAL_CONV
tests_partial_conv_chorus_opencl_la_LDFLAGS = $(AM_LDFLAGS) -module -avoid-version -shared \
	-rpath $(abs_builddir)/tests/partial-conv
AM_TESTS_ENVIRONMENT += \
	CHORUS_TEST_WRONG_ABI_DIR='$(abs_top_builddir)/tests/wrong-abi/.libs'; \
	CHORUS_TEST_MISSING_SLOT_DIR='$(abs_top_builddir)/tests/missing-slot/.libs'; \
	CHORUS_TEST_PARTIAL_CONV_DIR='$(abs_top_builddir)/tests/partial-conv/.libs'; \
	export CHORUS_TEST_WRONG_ABI_DIR CHORUS_TEST_MISSING_SLOT_DIR CHORUS_TEST_PARTIAL_CONV_DIR;

# A module with the required slots alone (device, memory, streams,
# transfers, GEMM) under a name the core does not know, found by the
# registry's scan of the backend path: test-fallback trains the mlp on it,
# every other op on the host backend, against the host alone.
check_LTLIBRARIES += tests/minimal/chorus-minimal.la
tests_minimal_chorus_minimal_la_SOURCES = tests/minimal-module.c tests/loop-gemm.h
tests_minimal_chorus_minimal_la_LDFLAGS = $(AM_LDFLAGS) -module -avoid-version -shared \
	-rpath $(abs_builddir)/tests/minimal
tests_minimal_chorus_minimal_la_LIBADD = libchorus.la
check_PROGRAMS += tests/test-fallback
tests_test_fallback_SOURCES = tests/test-fallback.c
tests_test_fallback_LDADD = $(TEST_INTERNAL_LIBS)
AM_TESTS_ENVIRONMENT += \
	CHORUS_TEST_MINIMAL_DIR='$(abs_top_builddir)/tests/minimal/.libs'; \
	export CHORUS_TEST_MINIMAL_DIR;
# The same module built twice as two backends of one made-up GPU (one PCI
# bus id, priorities 50 and 10): test-twin checks that the lower one is
# hidden as its duplicate and opens when named.
check_LTLIBRARIES += tests/twin/chorus-twinhi.la tests/twin/chorus-twinlo.la
tests_twin_chorus_twinhi_la_SOURCES = tests/minimal-module.c tests/loop-gemm.h
tests_twin_chorus_twinhi_la_CPPFLAGS = $(AM_CPPFLAGS) -DMINIMAL_NAME='"twinhi"' \
	-DMINIMAL_PRIORITY=50 -DMINIMAL_PCI='"0000:17:00.0"'
tests_twin_chorus_twinhi_la_LDFLAGS = $(AM_LDFLAGS) -module -avoid-version -shared \
	-rpath $(abs_builddir)/tests/twin
tests_twin_chorus_twinhi_la_LIBADD = libchorus.la
tests_twin_chorus_twinlo_la_SOURCES = tests/minimal-module.c tests/loop-gemm.h
tests_twin_chorus_twinlo_la_CPPFLAGS = $(AM_CPPFLAGS) -DMINIMAL_NAME='"twinlo"' \
	-DMINIMAL_PRIORITY=10 -DMINIMAL_PCI='"0000:17:00.0"'
tests_twin_chorus_twinlo_la_LDFLAGS = $(AM_LDFLAGS) -module -avoid-version -shared \
	-rpath $(abs_builddir)/tests/twin
tests_twin_chorus_twinlo_la_LIBADD = libchorus.la
check_PROGRAMS += tests/test-twin
tests_test_twin_SOURCES = tests/test-twin.c
tests_test_twin_LDADD = $(TEST_INTERNAL_LIBS)
AM_TESTS_ENVIRONMENT += \
	CHORUS_TEST_TWIN_DIR='$(abs_top_builddir)/tests/twin/.libs'; \
	export CHORUS_TEST_TWIN_DIR;
# A module whose devices fail or hang on command (tests/flaky-module.c):
# the tests of a device lost in the middle of training.
check_LTLIBRARIES += tests/flaky/chorus-flaky.la
tests_flaky_chorus_flaky_la_SOURCES = tests/flaky-module.c tests/loop-gemm.h
tests_flaky_chorus_flaky_la_LDFLAGS = $(AM_LDFLAGS) -module -avoid-version -shared \
	-rpath $(abs_builddir)/tests/flaky
tests_flaky_chorus_flaky_la_LIBADD = libchorus.la
check_PROGRAMS += tests/test-flaky
tests_test_flaky_SOURCES = tests/test-flaky.c
tests_test_flaky_CPPFLAGS = $(AM_CPPFLAGS) -DCHI_TEST_HOOKS
tests_test_flaky_LDADD = tests/libnn-hooks.la $(TEST_INTERNAL_LIBS) $(PTHREAD_LIBS)
AM_TESTS_ENVIRONMENT += \
	CHORUS_TEST_FLAKY_DIR='$(abs_top_builddir)/tests/flaky/.libs'; \
	export CHORUS_TEST_FLAKY_DIR;

# The math mode (ch_math_set, CHORUS_TF32) and its GEMMs on every device.
check_PROGRAMS += tests/test-math-mode
tests_test_math_mode_SOURCES = tests/test-math-mode.c
tests_test_math_mode_LDADD = $(TEST_LIBS)
