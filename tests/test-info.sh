#!/bin/sh
# chorus-info: the JSON parses and lists the devices, CHORUS_DEVICES limits
# them, options are checked.
info=${CHORUS_INFO:-./utils/chorus-info}
tmp=${TMPDIR:-/tmp}/test-info.$$
trap 'rm -f "$tmp".*' EXIT

if ! command -v python3 >/dev/null 2>&1; then
    echo "1..0 # SKIP python3 is missing (needed to parse the JSON)"
    exit 0
fi

. "$(dirname "$0")/tap.sh"

# ids of the devices in the JSON on stdin, comma-separated; fails if it does
# not parse, is not one array, or a device lacks a required key.
json_ids() {
    python3 -c '
import json, sys
devs = json.load(sys.stdin)
assert isinstance(devs, list), "not an array"
keys = ("id", "backend", "platform", "name", "vendor", "memory_bytes", "compute_units",
        "pci_bus_id", "numa_node", "kind", "in_all", "note", "cpuset",
        "max_alloc_bytes")
for d in devs:
    missing = [k for k in keys if k not in d]
    assert not missing, "%s lacks %s" % (d.get("id"), missing)
print(",".join(d["id"] for d in devs))
'
}

"$info" >"$tmp.txt" 2>"$tmp.err"
status=$?
ok $status "chorus-info prints its table (stderr: $(head -c 300 "$tmp.err" | tr '\n#' '  '))"

"$info" --json >"$tmp.json" 2>"$tmp.err"
status=$?
ok $status "chorus-info --json exits 0 (stderr: $(head -c 300 "$tmp.err" | tr '\n#' '  '))"

ids=$(json_ids <"$tmp.json" 2>"$tmp.err")
status=$?
ok $status "the JSON parses and every device has the required keys ($(tail -n 1 "$tmp.err" | tr '#' ' '))"

case ",$ids," in
*,host,*) ok 0 "the JSON lists host (ids: $ids)" ;;
*) ok 1 "the JSON lists host (ids: $ids)" ;;
esac

if [ -n "${POCL_DEVICES:-}" ] && grep -Eq '^ +opencl +loaded' "$tmp.txt"; then
    case ",$ids," in
    *,opencl:0,*opencl:1,*) ok 0 "with POCL_DEVICES=\"$POCL_DEVICES\", opencl:0 and opencl:1 are listed (ids: $ids)" ;;
    *) ok 1 "with POCL_DEVICES=\"$POCL_DEVICES\", opencl:0 and opencl:1 are listed (ids: $ids)" ;;
    esac
else
    skip "the OpenCL backend is not loaded or POCL_DEVICES is unset"
fi

# Every OpenCL device names its platform (in the table too); the host none.
platforms=$(python3 -c '
import json, sys
devs = json.load(sys.stdin)
bad = [d["id"] for d in devs
       if (d["backend"] == "opencl") != (d["platform"] != "")]
print("bad:" + ",".join(bad) if bad else
      ";".join(sorted(set(d["platform"] for d in devs if d["platform"]))))
' <"$tmp.json" 2>&1)
case $platforms in
bad:* | *Traceback*) ok 1 "every OpenCL device names its platform, no other device does: $platforms" ;;
*)
    missing=""
    old_ifs=$IFS
    IFS=';'
    for p in $platforms; do
        grep -qF "$p" "$tmp.txt" || missing="$missing $p"
    done
    IFS=$old_ifs
    test -z "$missing"
    ok $? "every OpenCL device names its platform, in the JSON and the table (platforms: ${platforms:-none}; missing from the table:${missing:- none})"
    ;;
esac

ids=$(CHORUS_DEVICES=host "$info" --json 2>"$tmp.err" | json_ids 2>>"$tmp.err")
test "$ids" = host
ok $? "CHORUS_DEVICES=host lists only host: got \"$ids\""

# A CHORUS_DEVICES longer than a device list may be (1023 characters) is an
# error, not a list cut inside a name; so is one of commas alone.
long=$(printf 'host,%.0s' $(seq 1 210))host
CHORUS_DEVICES=$long "$info" >"$tmp.out" 2>"$tmp.err"
status=$?
test "$status" -ne 0 && grep -q 'CHORUS_DEVICES is 1054 characters long' "$tmp.err"
ok $? "a CHORUS_DEVICES of 1054 characters is refused: status $status, $(head -c 200 "$tmp.err")"
CHORUS_DEVICES=',,' "$info" >"$tmp.out" 2>"$tmp.err"
status=$?
test "$status" -ne 0 && grep -q 'names no device' "$tmp.err"
ok $? "CHORUS_DEVICES=,, is refused: status $status, $(head -c 200 "$tmp.err")"

"$info" --no-such-option >"$tmp.out" 2>"$tmp.err"
status=$?
test "$status" -eq 2
ok $? "a bad option exits 2: got $status"
lines=$(wc -l <"$tmp.err")
test "$lines" -eq 1 && test ! -s "$tmp.out" && grep -q -- '--no-such-option' "$tmp.err"
ok $? "a bad option gives one line on stderr naming it, nothing on stdout: got $lines lines"

"$info" --version >"$tmp.out" 2>&1
status=$?
test "$status" -eq 0 && grep -Eq '[0-9]+\.[0-9]+\.[0-9]+' "$tmp.out"
ok $? "--version prints a version: got status $status, \"$(head -n 1 "$tmp.out")\""

"$info" --help >"$tmp.out" 2>&1
status=$?
test "$status" -eq 0 && grep -q -- '--json' "$tmp.out"
ok $? "--help exits 0 and describes --json: got status $status"

# With no OpenCL driver installed (an ICD loader that finds no vendor), the
# OpenCL backend is reported unavailable with the reason, and the rest works.
if grep -Eq '^ +opencl +loaded' "$tmp.txt"; then
    mkdir -p "$tmp.noicd"
    OCL_ICD_VENDORS="$tmp.noicd" "$info" >"$tmp.out" 2>&1
    status=$?
    rmdir "$tmp.noicd"
    test "$status" -eq 0 && grep -Eq '^ +opencl +unavailable +no OpenCL platform' "$tmp.out" &&
        grep -Eq '^ +host ' "$tmp.out"
    ok $? "with no OpenCL driver, OpenCL is unavailable with the reason and host still runs: status $status, $(grep -E '^ +opencl ' "$tmp.out" | tr -s ' ')"
else
    skip "the OpenCL backend is not loaded here"
fi

tap_done
