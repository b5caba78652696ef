# Tests of the reducer (chorus/reduce.h): every mode over host, OpenCL and
# CUDA participants; cases whose devices are missing are skipped by name.
check_PROGRAMS += tests/test-reduce
tests_test_reduce_SOURCES = tests/test-reduce.c
tests_test_reduce_LDADD = $(TEST_LIBS)
