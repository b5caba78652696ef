# The host backend: plain C, OpenBLAS for GEMM when configured; built into
# libchorus as the reference every other backend is tested against.
# tests/test-abi compiles them too, to call the slots directly.
host_backend_sources = \
	backends/host/host.h \
	backends/host/host.c \
	backends/host/gemm.c \
	backends/host/elementwise.c \
	backends/host/reduce.c \
	backends/host/conv.c \
	backends/host/optim.c \
	backends/host/allreduce.c
libchorus_la_SOURCES += $(host_backend_sources)
