# Installed programs.
bin_PROGRAMS += utils/chorus-info
utils_chorus_info_SOURCES = utils/chorus-info.c
utils_chorus_info_LDADD = libchorus.la

# chorus-train's option parser is a file of its own, also built into
# tests/fuzz/fuzz-train-options; its progress line is another.
bin_PROGRAMS += utils/chorus-train
utils_chorus_train_SOURCES = utils/chorus-train.c utils/train-options.c utils/train-options.h \
	utils/progress.c utils/progress.h
utils_chorus_train_LDADD = libchorus.la $(PTHREAD_LIBS) -lm

# The supervised launch: a job restarted from its checkpoint on fewer
# processes when one fails (a shell script).
dist_bin_SCRIPTS = utils/chorus-elastic
