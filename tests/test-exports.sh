#!/bin/sh
# What the built libraries export: libchorus the public API (ch_*) and
# the services the backend modules link against (chi_error,
# chi_workspace_* and chi_staging_* for the memory they allocate
# themselves, chi_math_flags: lib/backend.h; chi_trace_on for
# chi_tracing(): lib/trace.h), nothing else (no test hook, no CHI_TEST_API
# internal, no other helper); each backend module its entry point alone.
# The test build of the library, tests/libchorus.so, exports the
# CHI_TEST_API internals under libchorus's own soname.
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
trap 'rm -f "$tmp" "$tmp".ld.*' EXIT

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
allowed="-e ^ch_ -e ^chi_error\$ -e ^chi_workspace_ -e ^chi_staging_ -e ^chi_trace_on\$"
allowed="$allowed -e ^chi_math_flags\$ -e ^__odr_asan\.chi_trace_on\$"
what="ch_*, chi_error, chi_workspace_*, chi_staging_*, chi_math_flags and chi_trace_on"
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

# The internals the tests reach stay local to the installed library.
for name in chi_trace_slice chi_tensor_stamp chi_adam_step_half; do
    printf '%s\n' "$syms" | grep -qx "$name"
    [ $? -ne 0 ]
    ok $? "libchorus keeps $name local"
done

# The test build of the library exports them, under libchorus's soname
# (what a backend module a test loads names): one copy of the library in
# a test's process.
tlib=$top/tests/.libs/libchorus.so
if [ -f "$tlib" ]; then
    tsyms=$(exported "$tlib")
    ok $? "nm -D $tlib"
    printf '%s\n' "$tsyms" | grep -qx chi_tensor_stamp
    ok $? "the test library exports chi_tensor_stamp"
    soname() { objdump -p "$1" 2>/dev/null | awk '$1 == "SONAME" { print $2 }'; }
    real=$(soname "$lib") test_soname=$(soname "$tlib")
    [ -n "$real" ] && [ "$real" = "$test_soname" ]
    ok $? "the test library's soname is libchorus's ($test_soname, $real)"
    # A test program on the test library that loads the OpenCL module:
    # the module's libchorus.so.N is the copy already loaded, not a second.
    prog=$top/tests/test-event-time
    mod=$top/backends/opencl/.libs/chorus-opencl.so
    if [ -x "$prog" ] && [ -f "$mod" ]; then
        rm -f "$tmp".ld.*
        LD_DEBUG=files LD_DEBUG_OUTPUT=$tmp.ld "$prog" >/dev/null 2>&1
        maps=$(cat "$tmp".ld.* | grep -c 'file=.*libchorus\.so.*generating link map')
        module=$(cat "$tmp".ld.* | grep -c 'file=.*chorus-opencl\.so.*dynamically loaded')
        rm -f "$tmp".ld.*
        [ "$maps" -eq 1 ] && [ "$module" -ge 1 ]
        ok $? "a test on the test library loads the OpenCL module and one libchorus ($maps loaded, the module $module times)"
    else
        skip "no OpenCL module or no tests/test-event-time in this build"
    fi
else
    skip "the test library is not built ($tlib)"
fi

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
