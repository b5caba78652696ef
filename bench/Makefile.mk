# Benchmarks: built with everything else so they cannot rot, run by hand
# (`make bench` builds just them), never by `make check`.
noinst_PROGRAMS += bench/bench-ops
bench_bench_ops_SOURCES = bench/bench-ops.c bench/refgemm.h
bench_bench_ops_CPPFLAGS = $(AM_CPPFLAGS) $(BLAS_CFLAGS) -I$(top_srcdir)/backends/host
bench_bench_ops_LDADD = tests/libchorus-internal.la libchorus.la $(ONEDNN_LIBS) $(BLAS_LIBS) -lm

noinst_PROGRAMS += bench/bench-train
bench_bench_train_SOURCES = bench/bench-train.c bench/bench.h bench/refgemm.h
bench_bench_train_CPPFLAGS = $(AM_CPPFLAGS) $(BLAS_CFLAGS)
bench_bench_train_CFLAGS = $(AM_CFLAGS) $(OPENMP_CFLAGS)
bench_bench_train_LDADD = libchorus.la $(ONEDNN_LIBS) $(BLAS_LIBS) -lm

noinst_PROGRAMS += bench/bench-dp
bench_bench_dp_SOURCES = bench/bench-dp.c bench/bench.h
bench_bench_dp_LDADD = libchorus.la

noinst_PROGRAMS += bench/bench-allreduce
bench_bench_allreduce_SOURCES = bench/bench-allreduce.c bench/bench.h
bench_bench_allreduce_CPPFLAGS = $(AM_CPPFLAGS) $(MPI_CFLAGS)
bench_bench_allreduce_LDADD = libchorus.la $(MPI_LIBS)

EXTRA_DIST += bench/bench-ranks.sh

.PHONY: bench
bench: bench/bench-ops bench/bench-train bench/bench-dp bench/bench-allreduce
