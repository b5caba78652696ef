# nn: data sets, loader, modules, optimizers, checkpoints. Built into
# libchorus; uses only the public API of lib/.

# Data sets (IDX through zlib) and the data loader.
libchorus_la_SOURCES += \
	nn/dataset.c \
	nn/dataset.h \
	nn/loader.c
