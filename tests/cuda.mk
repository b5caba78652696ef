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
