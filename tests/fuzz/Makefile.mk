# libFuzzer harnesses (tests/fuzz/README.md). Each harness is
# tests/fuzz/fuzz-NAME.c; its corpus (seeds, and the inputs of the bugs
# fuzzing found) is tests/fuzz/corpus/NAME/, its dictionary, if any,
# tests/fuzz/dict/NAME.dict.
# - Every build: a TAP test runs each harness once over its corpus through
#   tests/fuzz/driver.c (make check); given files or folders, it runs
#   those (a crash reproduced in any build: tests/fuzz/fuzz-NAME FILE).
#   Without --enable-fuzzing that program is tests/fuzz/fuzz-NAME itself.
# - --enable-fuzzing (clang): tests/fuzz/fuzz-NAME is the harness with
#   libFuzzer's main (make fuzz), tests/fuzz/corpus-NAME the TAP test.
FUZZ_COMMON = tests/fuzz/fuzz.h tests/fuzz/fuzz-util.c
FUZZ_CPP = $(AM_CPPFLAGS) -I$(top_srcdir)/tests/fuzz -I$(top_srcdir)/utils $(ZLIB_CFLAGS)
FUZZ_LIBS = libchorus.la $(ZLIB_LIBS) $(PTHREAD_LIBS) -lm
EXTRA_DIST += tests/fuzz/README.md tests/fuzz/seeds.py tests/fuzz/corpus tests/fuzz/dict

FUZZ_HARNESSES = tests/fuzz/fuzz-idx tests/fuzz/fuzz-safetensors tests/fuzz/fuzz-tokens \
	tests/fuzz/fuzz-devices tests/fuzz/fuzz-train-options
if FUZZING
noinst_PROGRAMS += $(FUZZ_HARNESSES)
check_PROGRAMS += tests/fuzz/corpus-idx tests/fuzz/corpus-safetensors tests/fuzz/corpus-tokens \
	tests/fuzz/corpus-devices tests/fuzz/corpus-train-options
# libFuzzer's main, and libchorus linked in statically: one instrumented
# binary.
FUZZ_LINK = $(AM_LDFLAGS) -static -fsanitize=fuzzer
FUZZ_MAIN =
else
check_PROGRAMS += $(FUZZ_HARNESSES)
FUZZ_LINK = $(AM_LDFLAGS)
FUZZ_MAIN = tests/fuzz/driver.c
endif

tests_fuzz_fuzz_idx_SOURCES = tests/fuzz/fuzz-idx.c $(FUZZ_COMMON)
tests_fuzz_fuzz_safetensors_SOURCES = tests/fuzz/fuzz-safetensors.c $(FUZZ_COMMON)
tests_fuzz_fuzz_tokens_SOURCES = tests/fuzz/fuzz-tokens.c $(FUZZ_COMMON)
tests_fuzz_fuzz_devices_SOURCES = tests/fuzz/fuzz-devices.c $(FUZZ_COMMON)
tests_fuzz_fuzz_train_options_SOURCES = tests/fuzz/fuzz-train-options.c \
	utils/train-options.c utils/train-options.h $(FUZZ_COMMON)
if !FUZZING
tests_fuzz_fuzz_idx_SOURCES += tests/fuzz/driver.c
tests_fuzz_fuzz_safetensors_SOURCES += tests/fuzz/driver.c
tests_fuzz_fuzz_tokens_SOURCES += tests/fuzz/driver.c
tests_fuzz_fuzz_devices_SOURCES += tests/fuzz/driver.c
tests_fuzz_fuzz_train_options_SOURCES += tests/fuzz/driver.c
endif
tests_fuzz_fuzz_idx_CPPFLAGS = $(FUZZ_CPP) -DFUZZ_CORPUS='"$(abs_top_srcdir)/tests/fuzz/corpus/idx"'
tests_fuzz_fuzz_safetensors_CPPFLAGS = $(FUZZ_CPP) -DFUZZ_CORPUS='"$(abs_top_srcdir)/tests/fuzz/corpus/safetensors"'
tests_fuzz_fuzz_tokens_CPPFLAGS = $(FUZZ_CPP) -DFUZZ_CORPUS='"$(abs_top_srcdir)/tests/fuzz/corpus/tokens"'
tests_fuzz_fuzz_devices_CPPFLAGS = $(FUZZ_CPP) -DFUZZ_CORPUS='"$(abs_top_srcdir)/tests/fuzz/corpus/devices"'
tests_fuzz_fuzz_train_options_CPPFLAGS = $(FUZZ_CPP) -DFUZZ_CORPUS='"$(abs_top_srcdir)/tests/fuzz/corpus/train-options"'
tests_fuzz_fuzz_idx_LDFLAGS = $(FUZZ_LINK)
tests_fuzz_fuzz_safetensors_LDFLAGS = $(FUZZ_LINK)
tests_fuzz_fuzz_tokens_LDFLAGS = $(FUZZ_LINK)
tests_fuzz_fuzz_devices_LDFLAGS = $(FUZZ_LINK)
tests_fuzz_fuzz_train_options_LDFLAGS = $(FUZZ_LINK)
tests_fuzz_fuzz_idx_LDADD = $(FUZZ_LIBS)
tests_fuzz_fuzz_safetensors_LDADD = $(FUZZ_LIBS)
tests_fuzz_fuzz_tokens_LDADD = $(FUZZ_LIBS)
tests_fuzz_fuzz_devices_LDADD = $(FUZZ_LIBS)
tests_fuzz_fuzz_train_options_LDADD = $(FUZZ_LIBS)

# The TAP tests of a fuzzing build: the same harnesses with the driver.
tests_fuzz_corpus_idx_SOURCES = $(tests_fuzz_fuzz_idx_SOURCES) tests/fuzz/driver.c
tests_fuzz_corpus_safetensors_SOURCES = $(tests_fuzz_fuzz_safetensors_SOURCES) tests/fuzz/driver.c
tests_fuzz_corpus_tokens_SOURCES = $(tests_fuzz_fuzz_tokens_SOURCES) tests/fuzz/driver.c
tests_fuzz_corpus_devices_SOURCES = $(tests_fuzz_fuzz_devices_SOURCES) tests/fuzz/driver.c
tests_fuzz_corpus_train_options_SOURCES = $(tests_fuzz_fuzz_train_options_SOURCES) tests/fuzz/driver.c
tests_fuzz_corpus_idx_CPPFLAGS = $(tests_fuzz_fuzz_idx_CPPFLAGS)
tests_fuzz_corpus_safetensors_CPPFLAGS = $(tests_fuzz_fuzz_safetensors_CPPFLAGS)
tests_fuzz_corpus_tokens_CPPFLAGS = $(tests_fuzz_fuzz_tokens_CPPFLAGS)
tests_fuzz_corpus_devices_CPPFLAGS = $(tests_fuzz_fuzz_devices_CPPFLAGS)
tests_fuzz_corpus_train_options_CPPFLAGS = $(tests_fuzz_fuzz_train_options_CPPFLAGS)
tests_fuzz_corpus_idx_LDADD = $(FUZZ_LIBS)
tests_fuzz_corpus_safetensors_LDADD = $(FUZZ_LIBS)
tests_fuzz_corpus_tokens_LDADD = $(FUZZ_LIBS)
tests_fuzz_corpus_devices_LDADD = $(FUZZ_LIBS)
tests_fuzz_corpus_train_options_LDADD = $(FUZZ_LIBS)

# make fuzz FUZZ_SECONDS=N: each harness for N seconds in turn, from its
# committed corpus; what it finds new goes to tests/fuzz/out/NAME/corpus in
# the build folder (the source tree is only read), crashes to
# tests/fuzz/out/NAME/ (crash-*, leak-*, timeout-*, oom-*). Fails when any
# harness does. FUZZ_NAMES picks harnesses, FUZZ_FLAGS adds libFuzzer
# options (e.g. FUZZ_FLAGS=-jobs=2).
FUZZ_SECONDS = 60
FUZZ_NAMES = idx safetensors tokens devices train-options
FUZZ_FLAGS =
if FUZZING
fuzz: $(FUZZ_HARNESSES)
	@failed=""; \
	for name in $(FUZZ_NAMES); do \
	    out=tests/fuzz/out/$$name; \
	    mkdir -p $$out/corpus || exit 1; \
	    dict=$(abs_top_srcdir)/tests/fuzz/dict/$$name.dict; \
	    test -f $$dict && dictflag=-dict=$$dict || dictflag=; \
	    echo "fuzz: $$name for $(FUZZ_SECONDS) s (log: $$out/fuzz.log)"; \
	    if ./tests/fuzz/fuzz-$$name -max_total_time=$(FUZZ_SECONDS) -timeout=30 \
	        -print_final_stats=1 -artifact_prefix=$$out/ $$dictflag $(FUZZ_FLAGS) \
	        $$out/corpus $(abs_top_srcdir)/tests/fuzz/corpus/$$name >$$out/fuzz.log 2>&1; then \
	        grep -E '^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::average_exec_per_sec)' \
	            $$out/fuzz.log | sed "s/^/  $$name: /"; \
	    else \
	        failed="$$failed $$name"; \
	        tail -n 40 $$out/fuzz.log; \
	        echo "fuzz: $$name FAILED; its input is in $(abs_builddir)/$$out/ (crash-*, leak-*, timeout-*, oom-*)"; \
	    fi; \
	done; \
	test -z "$$failed" || { echo "fuzz: failed:$$failed"; exit 1; }
else
fuzz:
	@echo "make fuzz: configure with CC=clang --enable-fuzzing (tests/fuzz/README.md)" >&2; exit 1
endif
.PHONY: fuzz
clean-local: clean-fuzz
clean-fuzz:
	-rm -rf tests/fuzz/out
.PHONY: clean-fuzz
