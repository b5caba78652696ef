# Tests of nn/.

# Data sets and the loader: small IDX files written at test time (idxgen).
check_PROGRAMS += tests/test-dataset tests/test-loader
tests_test_dataset_SOURCES = tests/test-dataset.c tests/idxgen.c tests/idxgen.h
tests_test_dataset_CPPFLAGS = $(AM_CPPFLAGS) $(ZLIB_CFLAGS)
tests_test_dataset_LDADD = $(TEST_LIBS) $(ZLIB_LIBS)
tests_test_loader_SOURCES = tests/test-loader.c tests/idxgen.c tests/idxgen.h
tests_test_loader_CPPFLAGS = $(AM_CPPFLAGS) $(ZLIB_CFLAGS)
tests_test_loader_LDADD = $(TEST_LIBS) $(ZLIB_LIBS)
