# TAP tests under Automake's harness. The backend modules are found in the
# build tree through CHORUS_BACKEND_PATH.
LOG_DRIVER = env AM_TAP_AWK='$(AWK)' $(SHELL) $(top_srcdir)/build-aux/tap-driver.sh
# Under --enable-sanitizers, LeakSanitizer (GCC 12's) can misread the
# dynamic TLS of the libraries PoCL loads and crash in its exit-time scan
# ("Tracer caught signal 11", a DTLS range such as 0xd9-0x8000011db) after
# every test passed; not intercepting __tls_get_addr keeps it off those
# ranges while leak checking stays on. A caller's ASAN_OPTIONS come after,
# so they win; other builds ignore the variable.
AM_TESTS_ENVIRONMENT = \
	CHORUS_BACKEND_PATH='$(abs_top_builddir)/backends/opencl/.libs:$(abs_top_builddir)/backends/cuda/.libs'; \
	POCL_DEVICES="$${POCL_DEVICES-pthread pthread}"; \
	ASAN_OPTIONS="intercept_tls_get_addr=0$${ASAN_OPTIONS:+:$$ASAN_OPTIONS}"; \
	export CHORUS_BACKEND_PATH POCL_DEVICES ASAN_OPTIONS;
if FAULT_INJECTION
AM_TESTS_ENVIRONMENT += CHORUS_FAULT_BUILD=yes; export CHORUS_FAULT_BUILD;
endif

noinst_HEADERS += tests/tap.h
# The TAP helpers; each program names the library it links after them.
check_LTLIBRARIES = tests/libtestutil.la
tests_libtestutil_la_SOURCES = tests/tap.c tests/tap.h

TEST_LIBS = tests/libtestutil.la libchorus.la -lm

# The installed libchorus exports the public API and the services the
# backend modules link against, nothing else (chorus_exports in
# lib/Makefile.mk; tests/test-exports.sh holds the line). The tests reach
# what lies below it in two ways, neither installed:
# - tests/libchorus.la: the same objects linked again without that list,
#   so it exports the internals marked CHI_TEST_API as well (the trace
#   recorder's calls, lib/stamp.h's tensor stamps and fused Adam step). It
#   keeps libchorus's soname, so a backend module a test loads, which
#   names libchorus.so.N, binds to this copy, already loaded, rather than
#   loading the installed one beside it. Link TEST_INTERNAL_LIBS instead
#   of TEST_LIBS, never both libraries.
check_LTLIBRARIES += tests/libchorus.la
tests_libchorus_la_SOURCES =
tests_libchorus_la_LIBADD = $(libchorus_la_OBJECTS) $(libchorus_la_LIBADD)
tests_libchorus_la_LDFLAGS = $(AM_LDFLAGS) -rpath '$(abs_builddir)/tests' \
	-version-info $(chorus_lt_version) $(OPENMP_CFLAGS)
TEST_INTERNAL_LIBS = tests/libtestutil.la tests/libchorus.la -lm
# - internals compiled a second time, with the test hooks
#   (CHI_TEST_HOOKS), into libraries of their own: discovery on made-up
#   machines, the blocked C GEMM (the fallback a build with OpenBLAS never
#   runs), the fused attention in each instruction set (the hooks choose
#   it) with its tile products, the host's f32 to bf16 rounding in each
#   path, the host convolution with its oneDNN path, and LayerNorm in each
#   build (the same hooks);
noinst_LTLIBRARIES += tests/libchorus-internal.la
tests_libchorus_internal_la_SOURCES = lib/discover.c lib/topology.c backends/host/gemm.c \
	backends/host/tile_mm.c backends/host/conv.c backends/host/dnnl.c \
	backends/host/dnnl_conv.c backends/host/dnnl_matmul.c \
	backends/host/attention.c backends/host/attention_amx.c backends/host/scratch.c \
	backends/host/tile_amx.c backends/host/bf16_round.c backends/host/norm.c
tests_libchorus_internal_la_CPPFLAGS = $(AM_CPPFLAGS) $(HWLOC_CFLAGS) $(BLAS_CFLAGS) -DCHI_TEST_HOOKS
tests_libchorus_internal_la_LIBADD = $(HWLOC_LIBS) $(ONEDNN_LIBS) $(BLAS_LIBS)
INTERNAL_LIBS = tests/libchorus-internal.la $(TEST_LIBS)
# - nn/ with the hooks that inject failures, linked ahead of
#   tests/libchorus.la (TEST_INTERNAL_LIBS): this copy of nn/ drives the
#   same core and backends through the public API and CHI_TEST_API.
check_LTLIBRARIES += tests/libnn-hooks.la
tests_libnn_hooks_la_SOURCES = $(nn_sources)
tests_libnn_hooks_la_CPPFLAGS = $(AM_CPPFLAGS) $(FAULT_CPPFLAGS) -DCHI_TEST_HOOKS $(ZLIB_CFLAGS) $(JANSSON_CFLAGS) \
	$(MPI_CFLAGS)
tests_libnn_hooks_la_LIBADD = $(ZLIB_LIBS) $(JANSSON_LIBS) $(PTHREAD_LIBS) $(MPI_LIBS)

check_PROGRAMS += tests/test-core
tests_test_core_SOURCES = tests/test-core.c
tests_test_core_LDADD = $(TEST_LIBS)

# The memory account and the limit (ch_device_memory_stats,
# ch_device_set_memory_limit) on every device.
check_PROGRAMS += tests/test-memory
tests_test_memory_SOURCES = tests/test-memory.c
tests_test_memory_LDADD = $(TEST_LIBS) $(PTHREAD_LIBS)

check_PROGRAMS += tests/test-clock
tests_test_clock_SOURCES = tests/test-clock.c
tests_test_clock_LDADD = $(TEST_LIBS)

# The trace recorder (lib/trace.c), its file read back with jansson.
check_PROGRAMS += tests/test-trace
# The timeline of data-parallel training, read back with jansson; under
# mpirun by tests/test-timeline.sh.
check_PROGRAMS += tests/test-timeline
tests_test_timeline_SOURCES = tests/test-timeline.c
tests_test_timeline_CPPFLAGS = $(AM_CPPFLAGS) $(JANSSON_CFLAGS)
tests_test_timeline_LDADD = $(TEST_LIBS) $(JANSSON_LIBS) $(PTHREAD_LIBS)
tests_test_trace_SOURCES = tests/test-trace.c
tests_test_trace_CPPFLAGS = $(AM_CPPFLAGS) $(JANSSON_CFLAGS)
tests_test_trace_LDADD = $(TEST_INTERNAL_LIBS) $(JANSSON_LIBS) $(PTHREAD_LIBS)

# Device time in the trace (lib/trace_clock.c, each backend's
# event_seconds) on every device, the files read back with jansson.
check_PROGRAMS += tests/test-event-time
tests_test_event_time_SOURCES = tests/test-event-time.c
tests_test_event_time_CPPFLAGS = $(AM_CPPFLAGS) $(JANSSON_CFLAGS)
tests_test_event_time_LDADD = $(TEST_INTERNAL_LIBS) $(JANSSON_LIBS) $(PTHREAD_LIBS)

check_PROGRAMS += tests/test-nn
tests_test_nn_SOURCES = tests/test-nn.c
tests_test_nn_LDADD = $(TEST_LIBS)

check_PROGRAMS += tests/test-dp
tests_test_dp_SOURCES = tests/test-dp.c
tests_test_dp_CPPFLAGS = $(AM_CPPFLAGS) -DCHI_TEST_HOOKS
tests_test_dp_LDADD = tests/libnn-hooks.la $(TEST_INTERNAL_LIBS)

check_PROGRAMS += tests/test-dp-elastic
tests_test_dp_elastic_SOURCES = tests/test-dp-elastic.c
tests_test_dp_elastic_CPPFLAGS = $(AM_CPPFLAGS) -DCHI_TEST_HOOKS
tests_test_dp_elastic_LDADD = tests/libnn-hooks.la $(TEST_INTERNAL_LIBS)

check_PROGRAMS += tests/test-dp-shard
tests_test_dp_shard_SOURCES = tests/test-dp-shard.c
tests_test_dp_shard_LDADD = $(TEST_LIBS)

check_PROGRAMS += tests/test-dp-memory
tests_test_dp_memory_SOURCES = tests/test-dp-memory.c
tests_test_dp_memory_LDADD = $(TEST_LIBS)

check_PROGRAMS += tests/test-cast
tests_test_cast_SOURCES = tests/test-cast.c
tests_test_cast_LDADD = $(TEST_LIBS)

check_PROGRAMS += tests/test-half
tests_test_half_SOURCES = tests/test-half.c
tests_test_half_LDADD = $(TEST_INTERNAL_LIBS)

# The CUDA embedding backward's order (sort, runs, sums) on the host.
check_PROGRAMS += tests/test-embedding-order
tests_test_embedding_order_SOURCES = tests/test-embedding-order.c backends/cuda/embedding_order.h
tests_test_embedding_order_LDADD = $(TEST_LIBS)

# lib/kernels/act.h's formulas as C, against their stated bounds.
check_PROGRAMS += tests/test-act-math
tests_test_act_math_SOURCES = tests/test-act-math.c
tests_test_act_math_LDADD = $(TEST_LIBS)

check_PROGRAMS += tests/test-kernel-index
tests_test_kernel_index_SOURCES = tests/test-kernel-index.c
tests_test_kernel_index_LDADD = $(TEST_LIBS)

check_PROGRAMS += tests/test-xent-online
tests_test_xent_online_SOURCES = tests/test-xent-online.c
tests_test_xent_online_LDADD = $(TEST_LIBS)

# The allocation-failure walk and the checkpoint's failing writes: only in
# a build configured --enable-fault-injection (CI's sanitizer build). The
# data-parallel walks, half of the time, in a program of their own, so
# that the two halves run side by side.
if FAULT_INJECTION
check_PROGRAMS += tests/test-fault tests/test-fault-dp
tests_test_fault_SOURCES = tests/test-fault.c
tests_test_fault_CPPFLAGS = $(AM_CPPFLAGS) -DCHI_TEST_HOOKS -DTEST_FAULT_PART=1
tests_test_fault_LDADD = tests/libnn-hooks.la $(TEST_INTERNAL_LIBS)
tests_test_fault_dp_SOURCES = tests/test-fault.c
tests_test_fault_dp_CPPFLAGS = $(AM_CPPFLAGS) -DCHI_TEST_HOOKS -DTEST_FAULT_PART=2
tests_test_fault_dp_LDADD = tests/libnn-hooks.la $(TEST_INTERNAL_LIBS)
endif
EXTRA_DIST += tests/test-fault.c

check_PROGRAMS += tests/test-dist-local
tests_test_dist_local_SOURCES = tests/test-dist-local.c
tests_test_dist_local_LDADD = $(TEST_LIBS)

# Across processes: not a test of its own but run under mpirun by
# tests/test-dist.sh, so built for `make check` outside check_PROGRAMS.
EXTRA_PROGRAMS = tests/test-dist
check_DATA = tests/test-dist$(EXEEXT)
CLEANFILES += tests/test-dist$(EXEEXT)
tests_test_dist_SOURCES = tests/test-dist.c
tests_test_dist_CPPFLAGS = $(AM_CPPFLAGS) -DCHI_TEST_HOOKS
tests_test_dist_LDADD = tests/libnn-hooks.la $(TEST_INTERNAL_LIBS)

TESTS += $(check_PROGRAMS) tests/test-train.sh tests/test-train-elastic.sh tests/test-train-lm.sh \
	tests/test-exports.sh tests/test-dist.sh tests/test-platforms.sh tests/test-timeline.sh \
	tests/test-tools.sh tests/test-elastic.sh
EXTRA_DIST += tests/tap.sh tests/test-train.sh tests/test-train-elastic.sh tests/test-train-lm.sh \
	tests/test-exports.sh tests/test-dist.sh tests/test-platforms.sh tests/lsan-mpi.supp \
	tests/test-timeline.sh tests/test-tools.sh tests/test-elastic.sh
AM_TESTS_ENVIRONMENT += CHORUS_TEST_BUILDDIR='$(abs_top_builddir)'; export CHORUS_TEST_BUILDDIR;
AM_TESTS_ENVIRONMENT += CHORUS_MPIRUN='$(MPIRUN)'; export CHORUS_MPIRUN;
# Under --enable-sanitizers, what Open MPI keeps until exit is not ours
# (tests/lsan-mpi.supp says what is suppressed and why).
AM_TESTS_ENVIRONMENT += \
	LSAN_OPTIONS="suppressions=$(abs_top_srcdir)/tests/lsan-mpi.supp$${LSAN_OPTIONS:+:$$LSAN_OPTIONS}"; \
	export LSAN_OPTIONS;
AM_TESTS_ENVIRONMENT += CHORUS_TRAIN='$(abs_top_builddir)/utils/chorus-train'; export CHORUS_TRAIN;

# Two vendors' OpenCL: beside PoCL (and any driver of this machine), Intel's
# CPU runtime, which ./bootstrap installs into the source tree for the tests
# alone (never on LD_LIBRARY_PATH: its folder holds a libOpenCL.so of its
# own). tests/opencl-vendors, remade at every `make check`, holds a copy of
# every .icd file of /etc/OpenCL/vendors and one naming the runtime when it
# is installed; the tests see it through OCL_ICD_VENDORS unless the caller
# sets OCL_ICD_VENDORS, or CHORUS_TEST_OPENCL=pocl leaves Intel's runtime
# out (the system's drivers alone). tests/test-platforms.sh says which.
# `make check INTEL_OPENCL=FILE` names another libintelocl.so.
INTEL_OPENCL = $(abs_top_srcdir)/.test-deps/intel-opencl/lib/libintelocl.so
OPENCL_SYSTEM_VENDORS = /etc/OpenCL/vendors
if HAVE_OPENCL
check_DATA += tests/opencl-vendors
endif
.PHONY: tests/opencl-vendors clean-opencl-vendors
tests/opencl-vendors:
	$(AM_V_GEN)rm -rf $@ $@.tmp && $(MKDIR_P) $@.tmp && \
	for f in $(OPENCL_SYSTEM_VENDORS)/*.icd; do \
	    test ! -f "$$f" || cp "$$f" $@.tmp/ || exit 1; \
	done && \
	if test -f '$(INTEL_OPENCL)'; then \
	    echo '$(INTEL_OPENCL)' >$@.tmp/chorus-test-intel-cpu.icd; \
	fi && \
	mv $@.tmp $@
clean-local: clean-opencl-vendors
clean-opencl-vendors:
	rm -rf tests/opencl-vendors tests/opencl-vendors.tmp
AM_TESTS_ENVIRONMENT += \
	CHORUS_TEST_INTEL_OPENCL='$(INTEL_OPENCL)'; \
	CHORUS_TEST_OPENCL_VENDORS='$(abs_top_builddir)/tests/opencl-vendors'; \
	export CHORUS_TEST_INTEL_OPENCL CHORUS_TEST_OPENCL_VENDORS; \
	if test -z "$${OCL_ICD_VENDORS-}" && test "$${CHORUS_TEST_OPENCL-}" != pocl && \
	    test -d "$$CHORUS_TEST_OPENCL_VENDORS"; then \
	    OCL_ICD_VENDORS=$$CHORUS_TEST_OPENCL_VENDORS; export OCL_ICD_VENDORS; \
	fi;

include tests/host.mk
include tests/opencl.mk
include tests/ops.mk
include tests/discovery.mk
include tests/cuda.mk
include tests/nn.mk
include tests/reduce.mk
include tests/train.mk

# README.md's commands and C example, its links, and docs/USAGE.md's
# options against configure --help and chorus-train --help.
TESTS += tests/test-readme.sh
EXTRA_DIST += tests/test-readme.sh

# docs/BENCHMARKS.md: every row of its tables dated, with a command whose
# program and options exist in the tree.
TESTS += tests/test-bench-docs.sh
EXTRA_DIST += tests/test-bench-docs.sh
