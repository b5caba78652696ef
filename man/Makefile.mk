# Man pages of the installed programs, written in man(7) roff by hand;
# configure puts the version into each (man/*.1.in). tests/test-man.sh
# holds each page's OPTIONS to its program's --help; tests/test-version.sh
# holds every place that states the version to configure.ac's.
# Automake distributes NEWS by itself.
man1_MANS = man/chorus-info.1 man/chorus-train.1 man/chorus-elastic.1

TESTS += tests/test-man.sh tests/test-version.sh
EXTRA_DIST += tests/test-man.sh tests/test-version.sh tests/man-render.sh
