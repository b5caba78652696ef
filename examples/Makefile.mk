# Examples: small programs that teach the API, built (so they cannot rot)
# but not installed.
noinst_PROGRAMS += examples/list-devices examples/train-one-device \
	examples/layers-on-two-devices examples/train-data-parallel \
	examples/mixed-vendors examples/quick-start
examples_list_devices_SOURCES = examples/list-devices.c
examples_list_devices_LDADD = libchorus.la
examples_train_one_device_SOURCES = examples/train-one-device.c
examples_train_one_device_LDADD = libchorus.la
examples_layers_on_two_devices_SOURCES = examples/layers-on-two-devices.c
examples_layers_on_two_devices_LDADD = libchorus.la
examples_train_data_parallel_SOURCES = examples/train-data-parallel.c
examples_train_data_parallel_LDADD = libchorus.la
examples_mixed_vendors_SOURCES = examples/mixed-vendors.c
examples_mixed_vendors_LDADD = libchorus.la
# The README's example, word for word (tests/test-readme.sh compares them).
examples_quick_start_SOURCES = examples/quick-start.c
examples_quick_start_LDADD = libchorus.la
