# Tests of the cuda area. test-cuda is built with or without CUDA: without
# a GPU it checks that the backend says why it is unavailable and that the
# rest of the library still works.
check_PROGRAMS += tests/test-cuda
tests_test_cuda_SOURCES = tests/test-cuda.c
tests_test_cuda_CPPFLAGS = $(AM_CPPFLAGS) $(cuda_test_defs)
tests_test_cuda_LDADD = $(TEST_LIBS) $(PTHREAD_LIBS)
if HAVE_CUDA
if HAVE_NCCL
cuda_test_defs = -DCH_TEST_HAVE_CUDA=1 -DCH_TEST_HAVE_NCCL=1
else
cuda_test_defs = -DCH_TEST_HAVE_CUDA=1
endif
else
cuda_test_defs =
endif

# The CUDA backend's fused attention tiles (backends/cuda/flash.h), run on
# the CPU in its kernels' order against attention in double: plain C, so
# built and run with or without CUDA.
check_PROGRAMS += tests/test-cuda-flash
tests_test_cuda_flash_SOURCES = tests/test-cuda-flash.c
tests_test_cuda_flash_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/backends/cuda
tests_test_cuda_flash_LDADD = $(TEST_LIBS)

# No step of the GPT or the ResNet runs an op on the host on a CUDA device
# (or the host); on OpenCL devices the ops that still do are listed as TODO.
check_PROGRAMS += tests/test-gpu-steps
tests_test_gpu_steps_SOURCES = tests/test-gpu-steps.c
tests_test_gpu_steps_LDADD = $(TEST_LIBS)
