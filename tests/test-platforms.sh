#!/bin/sh
# The OpenCL platforms the suite runs on: two vendors' (PoCL and Intel's CPU
# runtime, which ./bootstrap installs into .test-deps/intel-opencl and the
# test environment registers through OCL_ICD_VENDORS; see tests/Makefile.mk).
# One check: it passes when two platforms are visible, is skipped (one line
# saying why) when the runtime is absent or left out, and fails when the
# runtime is installed and registered but does not show up as a platform.
info=${CHORUS_INFO:-./utils/chorus-info}
intel=${CHORUS_TEST_INTEL_OPENCL:-}
ours=${CHORUS_TEST_OPENCL_VENDORS:-}
mode=${CHORUS_TEST_OPENCL:-all}
tmp=${TMPDIR:-/tmp}/test-platforms.$$
trap 'rm -f "$tmp".*' EXIT

. "$(dirname "$0")/tap.sh"

case $mode in
all | pocl) ;;
*)
    ok 1 "CHORUS_TEST_OPENCL is \"$mode\": expected all (the default) or pocl"
    tap_done
    ;;
esac
if ! command -v python3 >/dev/null 2>&1; then
    skip "python3 is missing (needed to read chorus-info's JSON)"
    tap_done
fi

"$info" >"$tmp.txt" 2>&1
status=$?
if [ "$status" -ne 0 ]; then
    ok 1 "$info exits $status: $(head -c 300 "$tmp.txt" | tr '\n#' '  ')"
    tap_done
fi
row=$(grep -E '^ +opencl +' "$tmp.txt" | tr -s ' ' | sed 's/^ //')
case $row in
*" loaded "*) ;;
*" not built"* | *" not found "* | "")
    skip "the OpenCL backend is not built here (${row:-no opencl row in chorus-info})"
    tap_done
    ;;
esac

# Was the runtime meant to be visible? Installed, not left out, and named by
# a .icd file of the ICD folder in use.
installed=no registered=no
if [ -n "$intel" ] && [ -f "$intel" ] && [ "$mode" = all ]; then
    installed=yes
    if [ -n "${OCL_ICD_VENDORS:-}" ] &&
        grep -qsxF "$intel" "$OCL_ICD_VENDORS"/*.icd; then
        registered=yes
    fi
fi

"$info" --json >"$tmp.json" 2>"$tmp.err"
platforms=$(python3 -c '
import json, sys
devs = json.load(sys.stdin)
names = sorted(set(d["platform"] for d in devs if d["backend"] == "opencl" and d["platform"]))
print("%d;%s" % (len(names), "; ".join(names)))
' <"$tmp.json" 2>>"$tmp.err")
status=$?
if [ "$status" -ne 0 ]; then
    ok 1 "chorus-info --json lists the devices' platforms ($(tail -n 2 "$tmp.err" | tr '\n#' '  '))"
    tap_done
fi
count=${platforms%%;*}
names=${platforms#*;}
seen="$count OpenCL platform(s): ${names:-none}"

if [ "$registered" = yes ]; then
    # Intel's CPU runtime names its platform "Intel(R) OpenCL" (its GPU
    # driver's is "Intel(R) OpenCL Graphics").
    case "; $names;" in
    *"; Intel(R) OpenCL;"*) test "$count" -ge 2 ;;
    *) false ;;
    esac
    ok $? "Intel's OpenCL CPU runtime ($intel, registered in $OCL_ICD_VENDORS: $(cd "$OCL_ICD_VENDORS" && echo *.icd)) shows up beside the others: $seen"
elif [ "$count" -ge 2 ]; then
    ok 0 "two OpenCL platforms or more are visible: $seen"
elif [ "$installed" = yes ] && [ -n "${OCL_ICD_VENDORS:-}" ] && [ "$OCL_ICD_VENDORS" != "$ours" ]; then
    skip "your OCL_ICD_VENDORS ($OCL_ICD_VENDORS) does not name Intel's OpenCL runtime ($intel): the suite runs on $seen"
elif [ "$installed" = yes ]; then
    ok 1 "Intel's OpenCL runtime is installed ($intel) but not registered: OCL_ICD_VENDORS is \"${OCL_ICD_VENDORS:-}\", expected ${ours:-a folder} with a .icd file naming it; $seen"
elif [ "$mode" = pocl ]; then
    skip "CHORUS_TEST_OPENCL=pocl leaves Intel's OpenCL runtime out: the suite runs on $seen"
else
    skip "Intel's OpenCL CPU runtime is absent (${intel:-no path given}): the suite runs on $seen; ./bootstrap installs it"
fi
tap_done
