# The CUDA backend module (chorus-cuda), built with nvcc through libtool.
#
# Automake knows no CUDA, so .cu files go through the suffix rule below.
# libtool's compile mode would hand nvcc a bare -fPIC, which nvcc rejects:
# -prefer-non-pic stops that and -Xcompiler=-fPIC (one word, or libtool
# eats the -Xcompiler) makes the objects position-independent anyway.
# -shared: one object per source (a module has no static library), so
# nvcc, by far the slowest compiler here, runs once per file.
# nvcc objects get no automatic dependency tracking: each depends on the
# headers it includes, listed by hand below.
cuda_module_sources = \
	backends/cuda/common.cu \
	backends/cuda/backend.cu \
	backends/cuda/memory.cu \
	backends/cuda/stream.cu \
	backends/cuda/gemm.cu \
	backends/cuda/elementwise.cu \
	backends/cuda/optim.cu \
	backends/cuda/sum.cu \
	backends/cuda/softmax.cu \
	backends/cuda/layout.cu \
	backends/cuda/pool.cu \
	backends/cuda/random.cu \
	backends/cuda/attention.cu \
	backends/cuda/flash.cu \
	backends/cuda/norm.cu \
	backends/cuda/allreduce.cu
cuda_module_headers = backends/cuda/common.cuh backends/cuda/embedding_order.h \
	backends/cuda/flash.h

# Distributed whatever configure found, so that `make dist` without CUDA
# still ships the module.
EXTRA_DIST += $(cuda_module_sources) $(cuda_module_headers) bench/bench-cublas.c \
	tests/gpu/check.sh tests/gpu/prepare.sh

if HAVE_NCCL
cuda_nccl_defs = -DCH_HAVE_NCCL=1
cuda_nccl_libs = -lnccl
else
cuda_nccl_defs =
cuda_nccl_libs =
endif

# --fmad=false: no fused multiply-adds in our kernels, so elementwise ops
# round like the host backend (they are memory-bound; cuBLAS is unaffected).
# --threads=0: the architectures of one file compile in parallel.
# Host code is held to the same warnings as the C sources.
CUDA_NVCCFLAGS = $(CUDA_GENCODE) --threads=0 -std=c++20 -O3 --fmad=false \
	-Xcompiler=-fPIC -Xcompiler=-Wall,-Wextra,-fvisibility=hidden \
	$(DEFAULT_INCLUDES) $(AM_CPPFLAGS) $(CPPFLAGS) -I$(CUDA_DIR)/include $(cuda_nccl_defs)

.cu.lo:
	$(AM_V_CC)$(LIBTOOL) $(AM_V_lt) --tag=CC $(AM_LIBTOOLFLAGS) $(LIBTOOLFLAGS) \
	  --mode=compile $(NVCC) -shared -prefer-non-pic $(CUDA_NVCCFLAGS) -c -o $@ $<

if HAVE_CUDA
backend_LTLIBRARIES += backends/cuda/chorus-cuda.la
backends_cuda_chorus_cuda_la_SOURCES = $(cuda_module_sources) $(cuda_module_headers)
# Static cudart: the module needs only the driver at run time. cuBLAS (and
# cuBLASLt, for the fused epilogues) and NCCL stay shared; the rpath finds
# them in the toolkit, and where they are missing dlopen fails with the
# loader's message, which the core reports.
backends_cuda_chorus_cuda_la_LDFLAGS = $(AM_LDFLAGS) -module -avoid-version -shared \
	-L$(CUDA_DIR)/lib64 -Wl,-rpath,$(CUDA_DIR)/lib64
backends_cuda_chorus_cuda_la_LIBADD = libchorus.la -lcublasLt -lcublas $(cuda_nccl_libs) \
	-lcudart_static -ldl -lrt -lpthread -lstdc++

$(cuda_module_sources:.cu=.lo): $(cuda_module_headers) lib/backend.h lib/error.h lib/trace.h lib/philox.h \
	lib/optim_consts.h $(kernel_math_headers) \
	include/chorus.h include/chorus/export.h include/chorus/status.h include/chorus/clock.h \
	include/chorus/trace.h include/chorus/device.h include/chorus/stream.h \
	include/chorus/tensor.h include/chorus/ops.h include/chorus/data.h include/chorus/nn.h \
	include/chorus/reduce.h include/chorus/dp.h

# SGEMM through cuBLAS called directly against ch_gemm on cuda:0 (issue 4's
# 95% bar); built with the module, run by tests/gpu/check.sh.
noinst_PROGRAMS += bench/bench-cublas
bench_bench_cublas_SOURCES = bench/bench-cublas.c
bench_bench_cublas_CPPFLAGS = $(AM_CPPFLAGS) -I$(CUDA_DIR)/include
bench_bench_cublas_LDFLAGS = $(AM_LDFLAGS) -L$(CUDA_DIR)/lib64 -Wl,-rpath,$(CUDA_DIR)/lib64
bench_bench_cublas_LDADD = libchorus.la -lcublas -lcudart_static -ldl -lrt -lpthread -lm
endif
