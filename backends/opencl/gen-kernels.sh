#!/bin/sh
# Writes backends/opencl/kernels.c on stdout: the OpenCL module's kernels
# and shared math as C string literals, and the enumerators that cross the
# backend ABI with the values the module is compiled with. Used by
# backends/opencl/Makefile.mk and by tests/gpu/check.sh (which builds
# without make), so both embed the same.
#
#   gen-kernels.sh SRCDIR ABI-HEADER... -- EMBEDDED-FILE...
#
# Paths are relative to SRCDIR. Every line of an ABI header that starts
# with an enumerator (CH_NAME, then =, a comma, a comment or nothing)
# becomes {"CH_NAME", CH_NAME} in chcl_enum_values (program.c passes them
# to every program as -D options); each embedded file (name.cl, name.h)
# becomes `const char chcl_src_<name>[]`, backslashes and quotes escaped,
# every line a literal ending in "\n" (so each basename must be unique).
set -e
srcdir=$1
shift
abi=""
while [ $# -gt 0 ] && [ "$1" != -- ]; do
    abi="$abi $1"
    shift
done
[ "${1:-}" = -- ] || { echo "usage: gen-kernels.sh SRCDIR ABI-HEADER... -- FILE..." >&2; exit 2; }
shift
sed=${SED:-sed}
echo '/* Generated from the .cl files, lib/philox.h and the enums of'
echo " *$abi by backends/opencl/gen-kernels.sh. */"
echo '#include "opencl.h"'
echo 'const chcl_enum_value chcl_enum_values[] = {'
for f in $abi; do
    $sed -n 's|^ *\(CH_[A-Z0-9_]*\)\( *[=,/].*\)\{0,1\}$|    {"\1", \1},|p' "$srcdir/$f"
done
echo '};'
echo 'const int chcl_enum_count = (int)(sizeof chcl_enum_values / sizeof chcl_enum_values[0]);'
for f in "$@"; do
    name=$(basename "$f" | $sed 's/\.[a-z]*$//')
    echo "const char chcl_src_$name[] ="
    $sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$/\\n"/' "$srcdir/$f"
    echo ';'
done
