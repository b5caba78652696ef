# Tests of the host area.

# The blocked C GEMM is tested on its own: the op tests reach it only in
# builds without OpenBLAS; and chi_host_gemm's halves of rows (a hook of
# the internal copy says which products it halves).
check_PROGRAMS += tests/test-host-gemm
tests_test_host_gemm_SOURCES = tests/test-host-gemm.c
tests_test_host_gemm_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/backends/host -DCHI_TEST_HOOKS
tests_test_host_gemm_LDADD = $(INTERNAL_LIBS)

# The host convolution through oneDNN, against a double loop (skips in
# builds without oneDNN).
check_PROGRAMS += tests/test-host-conv
tests_test_host_conv_SOURCES = tests/test-host-conv.c
tests_test_host_conv_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/backends/host
tests_test_host_conv_LDADD = $(INTERNAL_LIBS)

# The fused attention in each instruction set the CPU runs (the hooks of
# the internal copy choose it), its row passes bit for bit across them.
check_PROGRAMS += tests/test-host-attn
tests_test_host_attn_SOURCES = tests/test-host-attn.c
tests_test_host_attn_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/backends/host -DCHI_TEST_HOOKS
tests_test_host_attn_LDADD = $(INTERNAL_LIBS)

# Host LayerNorm, forward and backward, in each instruction set the CPU
# runs (the same hooks): bit for bit across them, and against double.
check_PROGRAMS += tests/test-host-norm
tests_test_host_norm_SOURCES = tests/test-host-norm.c
tests_test_host_norm_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/backends/host -DCHI_TEST_HOOKS
tests_test_host_norm_LDADD = $(INTERNAL_LIBS)
