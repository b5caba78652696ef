# nn: data sets, loader, modules, losses, optimizers, checkpoints, data
# parallelism. Built into libchorus; uses the public API of lib/ and these
# private headers (docs/DESIGN.md, nn): lib/error.h (chi_error, TRY),
# lib/trace.h (the trace recorder), lib/stamp.h (the kept half weights and
# the fused Adam step) and the header-only lib/bf16_sum.h (the host's bf16
# sums, for the one across processes, in nn/dist_mpi.c).
# tests/Makefile.mk builds these sources a second time, with the test
# hooks, for the tests that inject failures.
nn_sources = \
	nn/dataset.c \
	nn/dataset.h \
	nn/loader.c \
	nn/tokens.c \
	nn/nn.h \
	nn/module.c \
	nn/containers.c \
	nn/layers.c \
	nn/norm.c \
	nn/gpt.c \
	nn/optim.c \
	nn/checkpoint.c \
	nn/presets.c \
	nn/dp.c \
	nn/dp_query.c \
	nn/dp_impl.h \
	nn/dp_worker.c \
	nn/dp_reduce.c \
	nn/dp_bn.c \
	nn/dp_join.c \
	nn/dp_trace.c \
	nn/dp_shard.c \
	nn/dp_elastic.c \
	nn/dp_watchdog.c \
	nn/dp_lose.c \
	nn/dist.c \
	nn/dist.h \
	nn/dist_impl.h \
	nn/split.c \
	nn/split.h
# The transport across processes: MPI's, or the single-process one.
if HAVE_MPI
nn_sources += nn/dist_mpi.c
else
nn_sources += nn/dist_local.c
endif
libchorus_la_SOURCES += $(nn_sources)
