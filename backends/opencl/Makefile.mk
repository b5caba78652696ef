# The OpenCL backend module (chorus-opencl), loaded at ch_init.
#
# The kernels live in .cl files and are compiled into the module as C string
# literals (kernels.c, written by gen-kernels.sh), so nothing is looked up at
# run time. lib/philox.h and the shared math of lib/kernels/ are embedded the
# same way (each header's basename must be unique): they are valid OpenCL C,
# and the programs are built from them, so every backend runs the same math.
opencl_kernels = \
	backends/opencl/common.cl \
	backends/opencl/elementwise.cl \
	backends/opencl/gemm.cl \
	backends/opencl/sum.cl \
	backends/opencl/softmax.cl \
	backends/opencl/conv.cl \
	backends/opencl/rand.cl \
	backends/opencl/attention.cl \
	backends/opencl/permute.cl \
	backends/opencl/norm.cl \
	backends/opencl/flash.cl
EXTRA_DIST += $(opencl_kernels) backends/opencl/gen-kernels.sh

if HAVE_OPENCL
backend_LTLIBRARIES += backends/opencl/chorus-opencl.la
backends_opencl_chorus_opencl_la_SOURCES = \
	backends/opencl/opencl.h \
	backends/opencl/backend.c \
	backends/opencl/error.c \
	backends/opencl/memory.c \
	backends/opencl/stream.c \
	backends/opencl/program.c \
	backends/opencl/ops.c \
	backends/opencl/conv.c \
	backends/opencl/gemm.c \
	backends/opencl/attention.c \
	backends/opencl/flash.c \
	backends/opencl/norm.c \
	backends/opencl/allreduce.c
nodist_backends_opencl_chorus_opencl_la_SOURCES = backends/opencl/kernels.c
# kernels.c is generated in the build tree and includes opencl.h.
backends_opencl_chorus_opencl_la_CPPFLAGS = $(AM_CPPFLAGS) $(FAULT_CPPFLAGS) -I$(top_srcdir)/backends/opencl
backends_opencl_chorus_opencl_la_LDFLAGS = $(AM_LDFLAGS) -module -avoid-version -shared
backends_opencl_chorus_opencl_la_LIBADD = libchorus.la $(OPENCL_LIBS) $(CLBLAST_LIBS) \
	$(PTHREAD_LIBS) -lm
CLEANFILES += backends/opencl/kernels.c
endif

opencl_embedded = $(opencl_kernels) lib/philox.h $(kernel_math_headers)

# The headers whose enums cross the backend ABI: their enumerators go into
# kernels.c with the values the C code was compiled with.
opencl_abi_headers = include/chorus/ops.h lib/backend.h

# kernels.c: the embedded files as C string literals and the ABI's
# enumerators, written by gen-kernels.sh (which tests/gpu/check.sh runs
# too, building without make).
backends/opencl/kernels.c: $(opencl_embedded) $(opencl_abi_headers) backends/opencl/Makefile.mk \
		backends/opencl/gen-kernels.sh
	$(AM_V_GEN)$(MKDIR_P) backends/opencl && SED='$(SED)' $(SHELL) \
	  $(srcdir)/backends/opencl/gen-kernels.sh $(srcdir) $(opencl_abi_headers) -- \
	  $(opencl_embedded) > $@-t && mv $@-t $@
