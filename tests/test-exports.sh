#!/bin/sh
# What the built libraries export: libchorus the public API (ch_*),
# the services the backend modules link against (chi_error,
# chi_workspace_* and chi_staging_* for the memory they allocate
# themselves, and chi_math_flags: lib/backend.h), the trace recorder's chi_trace_*
# (lib/trace.h: for the modules and the test copies of nn/) and the
# stamps and fused Adam step the kept half weights rest on (lib/stamp.h:
# for the test copies of nn/ and the tests), nothing else
# (no test hook, no other internal helper); each backend module its entry
# point alone.
top=${CHORUS_TEST_BUILDDIR:-.}
lib=$top/.libs/libchorus.so

if ! command -v nm >/dev/null 2>&1; then
    echo "1..0 # SKIP nm is missing"
    exit 0
fi
if [ ! -f "$lib" ]; then
    echo "1..0 # SKIP no shared libchorus in this build ($lib)"
    exit 0
fi

. "$(dirname "$0")/tap.sh"

tmp=${TMPDIR:-/tmp}/test-exports.$$
trap 'rm -f "$tmp"' EXIT

# The dynamic symbols a library defines, one per line; fails when nm does.
exported() {
    nm -D --defined-only "$1" >"$tmp" || return 1
    awk 'NF == 3 { print $3 }' "$tmp"
}

syms=$(exported "$lib")
ok $? "nm -D $lib"
count=$(printf '%s\n' "$syms" | grep -c '^ch_')
[ "$count" -ge 100 ]
ok $? "libchorus exports the public API ($count ch_* symbols)"
# A fault-injection build (configure --enable-fault-injection, never
# installed) exports its counters and counted calls, chi_fault_*, as well.
# AddressSanitizer marks each exported variable with an ODR indicator,
# __odr_asan.<name> (chi_trace_on in a sanitizer build).
allowed="-e ^ch_ -e ^chi_error\$ -e ^chi_workspace_ -e ^chi_staging_ -e ^chi_trace_"
allowed="$allowed -e ^chi_math_flags\$"
allowed="$allowed -e ^chi_tensor_stamp\$ -e ^chi_adam_half_fused\$ -e ^chi_adam_step_half\$"
allowed="$allowed -e ^__odr_asan\.chi_trace_"
what="ch_*, chi_error, chi_workspace_*, chi_staging_*, chi_math_flags, chi_trace_* and lib/stamp.h's three"
if [ "${CHORUS_FAULT_BUILD:-}" = yes ]; then
    allowed="$allowed -e ^chi_fault_"
    what="$what (and chi_fault_*: a fault-injection build)"
    printf '%s\n' "$syms" | grep -q '^chi_fault_arm$'
    ok $? "the fault-injection build exports chi_fault_arm"
fi
# shellcheck disable=SC2086
extra=$(printf '%s\n' "$syms" | grep -v $allowed | tr '\n' ' ')
[ -z "$extra" ]
ok $? "libchorus exports nothing but $what${extra:+ (also: $extra)}"

for name in opencl cuda; do
    mod=$top/backends/$name/.libs/chorus-$name.so
    if [ ! -f "$mod" ]; then
        skip "the $name module is not built"
        continue
    fi
    syms=$(exported "$mod" | tr '\n' ' ')
    [ "$syms" = "chorus_backend_entry " ]
    ok $? "chorus-$name.so exports chorus_backend_entry alone (got: $syms)"
done

tap_done
