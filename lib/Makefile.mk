# The core library: libchorus (shared and static). The host backend's
# sources are added by backends/host/Makefile.mk.
lib_LTLIBRARIES += libchorus.la
libchorus_la_SOURCES = \
	lib/error.c \
	lib/clock.c \
	lib/trace.c \
	lib/trace_clock.c \
	lib/registry.c \
	lib/device.c \
	lib/discover.c \
	lib/topology.c \
	lib/stream.c \
	lib/alloc.c \
	lib/math_mode.c \
	lib/tensor.c \
	lib/ops.c \
	lib/ops_attn.c \
	lib/ops_norm.c \
	lib/ops_conv.c \
	lib/ops_fallback.c \
	lib/ops_half.c \
	lib/reduce.c \
	lib/reduce_span.c \
	lib/reduce_trace.c \
	lib/sum_spread.c \
	lib/version.c \
	lib/philox.c \
	lib/error.h \
	lib/trace.h \
	lib/stamp.h \
	lib/reduce_impl.h \
	lib/omp.h \
	lib/core.h \
	lib/opcheck.h \
	lib/backend.h \
	lib/discover.h \
	lib/registry.h \
	lib/philox.h \
	lib/bf16_sum.h \
	lib/optim_consts.h \
	lib/fault.h \
	$(kernel_math_headers)
# The kernels' math shared by every backend (lib/kernels/prelude.h says how).
kernel_math_headers = \
	lib/kernels/prelude.h \
	lib/kernels/act.h \
	lib/kernels/half_bits.h \
	lib/kernels/optim_step.h \
	lib/kernels/normalize.h \
	lib/kernels/xent.h \
	lib/kernels/attn.h \
	lib/kernels/index.h
# A test build's counted allocations and writes (configure
# --enable-fault-injection; lib/fault.h).
if FAULT_INJECTION
libchorus_la_SOURCES += lib/fault.c
endif
EXTRA_DIST += lib/fault.c
libchorus_la_CPPFLAGS = $(AM_CPPFLAGS) $(FAULT_CPPFLAGS) $(BLAS_CFLAGS) $(HWLOC_CFLAGS) $(ZLIB_CFLAGS) $(JANSSON_CFLAGS) \
	$(MPI_CFLAGS)
libchorus_la_LIBADD = $(ONEDNN_LIBS) $(BLAS_LIBS) $(MVEC_LIBS) $(HWLOC_LIBS) $(ZLIB_LIBS) $(JANSSON_LIBS) $(PTHREAD_LIBS) \
	$(MPI_LIBS)
# -version-info current:revision:age (libtool's rules): current goes up
# with every change that breaks callers built against the previous
# headers (1: argument orders, ch_train_state's normalisation fields;
# 2: ch_dp_options' fields for BatchNorm and token data, with the new ops
# and modules for the ResNet and the GPT, ch_conv2d among them; 3:
# ch_dp_options.dist, with chorus/dist.h and ch_reducer_set_stage; 4:
# ch_dp_options' precision, loss scale and reduce_dtype and ch_train_state's
# loss scale, with half precision in the ops, ch_module_set_precision,
# ch_reducer_set_dtype, ch_reducer_set_stage_bf16 and ch_dist_sum_bf16;
# 5: ch_device_info.platform; 8: ch_memory_stats' fields after
# cache_flushes, which ch_device_memory_stats writes whole, with
# ch_device_reset_peak and ch_device_set_memory_limit; 9: ch_dp_options'
# shard_optimizer, memory_limits, recompute, elastic and elastic_timeout,
# with ch_dp_changes, ch_dp_rejoin, ch_dp_replica_count and ch_dp_device).
# revision goes up when the interfaces stay and what they do grows (4:1:0:
# ch_conv2d and its backward take half inputs, refused before). Functions
# added, none changed: current and age go up together and the soname stays
# (6:0:1: ch_fallback_count and ch_fallback_get; 7:0:2: ch_trace_start,
# ch_trace_stop and ch_trace_running; 10:0:1: ch_attention and
# ch_attention_backward; 11:0:2: ch_attention_packed and its backward;
# 12:0:3: ch_attention_packed_mixed and its backward; 13:0:4:
# ch_softmax_xent_fused, ch_loss_forward_backward, ch_device_counters_start
# and _read, ch_optimizer_set_one_by_one, ch_gemm_bias_act, ch_add_layernorm,
# ch_layernorm_backward_add and CH_ACT_GELU_TANH).
chorus_lt_version = 13:0:4
# What the installed library exports: the public API (ch_*) and the
# services the backend modules link against (lib/backend.h, lib/error.h,
# chi_trace_on in lib/trace.h); a fault-injection build, never installed,
# its counters too. Everything else, CHI_TEST_API's internals included,
# stays local (tests/test-exports.sh holds the line; tests/Makefile.mk
# builds the library again from the same objects, exporting them).
chorus_exports = ch_|chi_error$$|chi_workspace_|chi_staging_|chi_math_flags$$|chi_trace_on$$
if FAULT_INJECTION
chorus_fault_exports = |chi_fault_
else
chorus_fault_exports =
endif
libchorus_la_LDFLAGS = $(AM_LDFLAGS) -version-info $(chorus_lt_version) $(OPENMP_CFLAGS) \
	-export-symbols-regex '^($(chorus_exports)$(chorus_fault_exports))'

# Installed as PREFIX/include/chorus.h and PREFIX/include/chorus/*.h, where
# pkg-config's -I${includedir} finds them (tests/installcheck.sh checks).
include_HEADERS += include/chorus.h
chorusincludedir = $(includedir)/chorus
chorusinclude_HEADERS = \
	include/chorus/export.h \
	include/chorus/clock.h \
	include/chorus/trace.h \
	include/chorus/status.h \
	include/chorus/device.h \
	include/chorus/stream.h \
	include/chorus/tensor.h \
	include/chorus/ops.h \
	include/chorus/data.h \
	include/chorus/nn.h \
	include/chorus/reduce.h \
	include/chorus/dist.h \
	include/chorus/dp.h
