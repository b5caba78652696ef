# Tests of nn/.

# Data sets and the loader: small IDX files written at test time (idxgen).
check_PROGRAMS += tests/test-dataset tests/test-loader
tests_test_dataset_SOURCES = tests/test-dataset.c tests/idxgen.c tests/idxgen.h
tests_test_dataset_CPPFLAGS = $(AM_CPPFLAGS) $(ZLIB_CFLAGS)
tests_test_dataset_LDADD = $(TEST_LIBS) $(ZLIB_LIBS)
tests_test_loader_SOURCES = tests/test-loader.c tests/idxgen.c tests/idxgen.h
tests_test_loader_CPPFLAGS = $(AM_CPPFLAGS) $(ZLIB_CFLAGS)
tests_test_loader_LDADD = $(TEST_LIBS) $(ZLIB_LIBS)

# Token data sets: shards and texts written at test time; Debian's fortunes
# texts when installed.
check_PROGRAMS += tests/test-tokens
tests_test_tokens_SOURCES = tests/test-tokens.c tests/idxgen.c tests/idxgen.h
tests_test_tokens_CPPFLAGS = $(AM_CPPFLAGS) $(ZLIB_CFLAGS)
tests_test_tokens_LDADD = $(TEST_LIBS) $(ZLIB_LIBS)

# The data-parallel split policy, nn/split.c built into the test with an
# allocator the test can make fail (nothing of it is exported).
check_PROGRAMS += tests/test-split
tests_test_split_SOURCES = tests/test-split.c nn/split.c nn/split.h
tests_test_split_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/nn -DNN_SPLIT_CALLOC=test_calloc
tests_test_split_LDADD = $(TEST_LIBS)

# The ResNet and the GPT against PyTorch's numbers (tests/fixtures/, from
# docs/pytorch/make_fixtures.py), and data parallel against one device.
check_PROGRAMS += tests/test-models
tests_test_models_CPPFLAGS = $(AM_CPPFLAGS) $(JANSSON_CFLAGS)
tests_test_models_LDADD = $(TEST_LIBS) $(JANSSON_LIBS)
EXTRA_DIST += tests/fixtures/gpt-tiny.safetensors tests/fixtures/resnet-tiny.safetensors

# Recomputed activations: the same bits with and without, on every device,
# and less memory. The copy of nn/ with its internals reachable, for the
# gradient hook and BatchNorm's exchange that ch_dp sets.
check_PROGRAMS += tests/test-recompute
tests_test_recompute_SOURCES = tests/test-recompute.c
tests_test_recompute_LDADD = tests/libnn-hooks.la $(TEST_INTERNAL_LIBS)
