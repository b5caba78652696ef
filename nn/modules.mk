# nn: modules, losses, optimizers (the data set and loader sources are in
# nn/Makefile.mk).
libchorus_la_SOURCES += \
	nn/nn.h \
	nn/module.c \
	nn/optim.c \
	nn/checkpoint.c \
	nn/presets.c \
	nn/dp.c \
	nn/split.c \
	nn/split.h
