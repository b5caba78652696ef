# The OpenCL backend module (chorus-opencl), loaded at ch_init.
#
# The kernels live in .cl files and are compiled into the module as C string
# literals (kernels.c, generated below with sed), so nothing is looked up at
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
	backends/opencl/norm.cl
EXTRA_DIST += $(opencl_kernels)

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

# The headers whose enums cross the backend ABI: every line that starts with
# an enumerator (CH_NAME, then =, a comma, a comment or nothing) becomes
# {"CH_NAME", CH_NAME} in chcl_enum_values, so the kernels get the values
# the C code was compiled with (program.c passes them as -D options).
opencl_abi_headers = include/chorus/ops.h lib/backend.h

# Each embedded file (name.cl, name.h) becomes `const char chcl_src_<name>[]`:
# backslashes and quotes escaped, every line a literal ending in "\n".
backends/opencl/kernels.c: $(opencl_embedded) $(opencl_abi_headers) backends/opencl/Makefile.mk
	$(AM_V_GEN)$(MKDIR_P) backends/opencl && { \
	  echo '/* Generated from the .cl files, lib/philox.h and the enums of'; \
	  echo ' * $(opencl_abi_headers) by backends/opencl/Makefile.mk. */'; \
	  echo '#include "opencl.h"'; \
	  echo 'const chcl_enum_value chcl_enum_values[] = {'; \
	  for f in $(opencl_abi_headers); do \
	    $(SED) -n 's|^ *\(CH_[A-Z0-9_]*\)\( *[=,/].*\)\{0,1\}$$|    {"\1", \1},|p' \
	      $(srcdir)/$$f || exit 1; \
	  done; \
	  echo '};'; \
	  echo 'const int chcl_enum_count = (int)(sizeof chcl_enum_values / sizeof chcl_enum_values[0]);'; \
	  for f in $(opencl_embedded); do \
	    name=`basename $$f | $(SED) 's/\.[a-z]*$$//'`; \
	    echo "const char chcl_src_$$name[] ="; \
	    $(SED) -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/' \
	      $(srcdir)/$$f || exit 1; \
	    echo ';'; \
	  done; } > $@-t && mv $@-t $@
