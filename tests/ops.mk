# Tests of the ops area: every op on every device against double-precision
# references (ref.c, shared through the test utility library), finite
# differences of every backward op, and bad arguments to every public call.
tests_libtestutil_la_SOURCES += tests/ref.c tests/ref.h

check_PROGRAMS += tests/test-ops tests/test-ops-grad tests/test-errors
tests_test_ops_SOURCES = tests/test-ops.c
tests_test_ops_LDADD = $(TEST_LIBS)
tests_test_ops_grad_SOURCES = tests/test-ops-grad.c
tests_test_ops_grad_LDADD = $(TEST_LIBS)
tests_test_errors_SOURCES = tests/test-errors.c
tests_test_errors_LDADD = $(TEST_LIBS) $(PTHREAD_LIBS)
