# The host backend: plain C, oneDNN or OpenBLAS for GEMM and oneDNN for
# convolutions when configured; built into
# libchorus. It is not the tests' reference: they compare every backend,
# this one included, with double-precision references (tests/ref.h).
libchorus_la_SOURCES += \
	backends/host/host.h \
	backends/host/vec.h \
	backends/host/backend.c \
	backends/host/gemm.c \
	backends/host/elementwise.c \
	backends/host/sum.c \
	backends/host/softmax.c \
	backends/host/conv.c \
	backends/host/dnnl_impl.h \
	backends/host/dnnl.c \
	backends/host/dnnl_conv.c \
	backends/host/dnnl_matmul.c \
	backends/host/optim.c \
	backends/host/batched.c \
	backends/host/attention.h \
	backends/host/attention.c \
	backends/host/attention_amx.c \
	backends/host/embedding.c \
	backends/host/tile_mm.c \
	backends/host/tile_amx.c \
	backends/host/bf16_round.c \
	backends/host/scratch.c \
	backends/host/norm.c \
	backends/host/allreduce.c
