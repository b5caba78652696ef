# Installed programs.
bin_PROGRAMS += utils/chorus-info
utils_chorus_info_SOURCES = utils/chorus-info.c
utils_chorus_info_LDADD = libchorus.la

bin_PROGRAMS += utils/chorus-train
utils_chorus_train_SOURCES = utils/chorus-train.c
utils_chorus_train_LDADD = libchorus.la $(PTHREAD_LIBS) -lm
