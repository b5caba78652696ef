# Tests of the opencl area. test-opencl skips itself (1..0 # SKIP) where no
# OpenCL device is visible, so it is built in every configuration.
check_PROGRAMS += tests/test-opencl
tests_test_opencl_SOURCES = tests/test-opencl.c
tests_test_opencl_LDADD = $(TEST_LIBS)

# What a training step on OpenCL asks of the host (skips itself without an
# OpenCL device): the stream's scratch kept and shared. It defines the
# OpenCL calls it counts, exported for the module to bind to.
if HAVE_OPENCL
check_PROGRAMS += tests/test-opencl-step
tests_test_opencl_step_SOURCES = tests/test-opencl-step.c
tests_test_opencl_step_LDFLAGS = -export-dynamic
tests_test_opencl_step_LDADD = $(TEST_LIBS) $(PTHREAD_LIBS) -ldl
endif

# The same tests with our own GEMM kernel where CLBlast would otherwise
# take every shape.
EXTRA_DIST += tests/opencl-gemm-own.sh
if HAVE_CLBLAST
TESTS += tests/opencl-gemm-own.sh
endif

# A peer copy's source is not overwritten or reused before the copy has
# read it (opencl:0 and opencl:1; skips itself without them).
check_PROGRAMS += tests/test-copy-order
tests_test_copy_order_SOURCES = tests/test-copy-order.c
tests_test_copy_order_LDADD = $(TEST_LIBS)

# The OpenCL op tests on devices capped smaller than they are (work-groups
# of 16, 48 and 128, local memory of 1 and 6 KiB: the fallbacks a small
# device takes), and the caps' bad values refused.
EXTRA_DIST += tests/opencl-limits.sh
if HAVE_OPENCL
TESTS += tests/opencl-limits.sh
endif

# The OpenCL op tests on oclgrind's simulated device, every access checked
# (CI's kernel check; by hand: sh ../tests/oclgrind.sh from a build folder).
EXTRA_DIST += tests/oclgrind.sh
clean-local: clean-oclgrind-logs
.PHONY: clean-oclgrind-logs
clean-oclgrind-logs:
	rm -rf tests/oclgrind-logs
