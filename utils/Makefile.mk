# Installed programs.
bin_PROGRAMS += utils/chorus-info
utils_chorus_info_SOURCES = utils/chorus-info.c
utils_chorus_info_LDADD = libchorus.la

# chorus-train: the driver, its state (trainer.h), its options (a file of
# their own, also built into tests/fuzz/fuzz-train-options), what it tells
# (report.c) and its progress line, SIGINT and SIGTERM, GPT sampling.
bin_PROGRAMS += utils/chorus-train
utils_chorus_train_SOURCES = utils/chorus-train.c utils/trainer.h \
	utils/train-options.c utils/train-options.h utils/report.c utils/report.h \
	utils/progress.c utils/progress.h utils/signals.c utils/signals.h \
	utils/sample.c utils/sample.h
utils_chorus_train_LDADD = libchorus.la $(PTHREAD_LIBS) -lm

# The supervised launch: a job restarted from its checkpoint on fewer
# processes when one fails (a shell script).
dist_bin_SCRIPTS = utils/chorus-elastic
