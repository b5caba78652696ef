#!/bin/sh
# The Python tools of tools/: chorus-trace-merge keeps every event and
# keeps the ranks' tracks apart; the plotting scripts answer --help, name
# a bad file and say how to install matplotlib when it is missing; with
# matplotlib, they draw.
srcdir=${CHORUS_TEST_SRCDIR:-$(dirname "$0")/..}
tools=$srcdir/tools
tmp=${TMPDIR:-/tmp}/test-tools.$$
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

if ! command -v python3 >/dev/null 2>&1; then
    echo "1..0 # SKIP python3 is missing (the tools are Python)"
    exit 0
fi

. "$(dirname "$0")/tap.sh"

# One rank's trace: pid 7 (both files use it), tracks steps, host and
# reducer, two steps, a forward holding a module's slice, a flow (id 1 in
# both files), an instant, a counter.
rank_trace() {
    cat <<EOF
{"traceEvents":[
{"name":"process_name","ph":"M","pid":7,"tid":0,"args":{"name":"chorus $1"}},
{"name":"thread_name","ph":"M","pid":7,"tid":1,"args":{"name":"steps"}},
{"name":"thread_sort_index","ph":"M","pid":7,"tid":1,"args":{"sort_index":0}},
{"name":"thread_name","ph":"M","pid":7,"tid":2,"args":{"name":"host"}},
{"name":"thread_sort_index","ph":"M","pid":7,"tid":2,"args":{"sort_index":1}},
{"name":"thread_name","ph":"M","pid":7,"tid":3,"args":{"name":"reducer"}},
{"name":"thread_sort_index","ph":"M","pid":7,"tid":3,"args":{"sort_index":2}},
{"name":"step 0","cat":"step","ph":"X","pid":7,"tid":1,"ts":0.000,"dur":900.000,"args":{"step":0}},
{"name":"step 1","cat":"step","ph":"X","pid":7,"tid":1,"ts":1000.000,"dur":900.000,"args":{"step":1}},
{"name":"forward mlp","cat":"compute","ph":"X","pid":7,"tid":2,"ts":1010.000,"dur":300.000},
{"name":"forward fc1","cat":"compute","ph":"X","pid":7,"tid":2,"ts":1020.000,"dur":100.000},
{"name":"wait for the reduction","cat":"wait","ph":"X","pid":7,"tid":2,"ts":1400.000,"dur":300.000},
{"name":"bucket 0","cat":"reduce","ph":"s","pid":7,"tid":2,"ts":1300.000,"id":1},
{"name":"bucket 0 sum","cat":"reduce","ph":"X","pid":7,"tid":3,"ts":1400.000,"dur":200.000},
{"name":"bucket 0","cat":"reduce","ph":"f","pid":7,"tid":3,"ts":1410.000,"id":1,"bp":"e"},
{"name":"lr","cat":"schedule","ph":"i","pid":7,"tid":1,"ts":1005.000,"s":"t"},
{"name":"bytes","ph":"C","pid":7,"tid":3,"ts":1400.000,"args":{"bytes":4096}}
],"displayTimeUnit":"ms"}
EOF
}
rank_trace "rank 0" >"$tmp/a.json"
rank_trace "rank 1" >"$tmp/b.json"

python3 "$tools/chorus-trace-merge" "$tmp/a.json" "$tmp/b.json" -o "$tmp/merged.json" 2>"$tmp/err"
status=$?
ok $status "chorus-trace-merge merges two traces (stderr: $(head -c 300 "$tmp/err" | tr '\n#' '  '))"

# Every event kept; the two files' pids distinct after the merge; each
# flow's two ends in one process.
check=$(python3 -c '
import json, sys
a, b, m = (json.load(open(p))["traceEvents"] for p in sys.argv[1:4])
names = {e["pid"]: e["args"]["name"] for e in m if e["name"] == "process_name"}
flows = {}
for e in m:
    if e["ph"] in "sf":
        flows.setdefault((e["cat"], e["id"]), set()).add(e["pid"])
print("events %d of %d, pids %s, %d flows, %d across processes" % (
    len(m), len(a) + len(b), sorted(names.items()), len(flows),
    sum(len(p) > 1 for p in flows.values())))
' "$tmp/a.json" "$tmp/b.json" "$tmp/merged.json" 2>&1)
case $check in
"events 34 of 34, pids [(7, 'chorus rank 0'), ("*", 'chorus rank 1')], 2 flows, 0 across processes") ok 0 "$check" ;;
*) ok 1 "every event kept, pids distinct, no flow across processes: got $(echo "$check" | tail -n 3 | tr '\n#' '  ')" ;;
esac

python3 "$tools/chorus-trace-merge" "$tmp/a.json" "$tmp/missing.json" -o "$tmp/out.json" >"$tmp/out" 2>"$tmp/err"
status=$?
test "$status" -eq 1 && test "$(wc -l <"$tmp/err")" -eq 1 && grep -q missing.json "$tmp/err"
ok $? "a missing input exits 1 with one line naming it: status $status, $(head -c 200 "$tmp/err" | tr '\n#' '  ')"

python3 "$tools/chorus-trace-merge" "$tmp/a.json" >"$tmp/out" 2>"$tmp/err"
status=$?
test "$status" -eq 2
ok $? "no -o exits 2: got $status"

python3 "$tools/chorus-trace-merge" --help >"$tmp/out" 2>&1
status=$?
test "$status" -eq 0 && grep -qF "jq -s '{traceEvents: map(.traceEvents) | add}'" "$tmp/out"
ok $? "chorus-trace-merge --help exits 0 and gives the jq equivalent: status $status"

for tool in chorus-trace-plot chorus-log-plot; do
    python3 "$tools/$tool" --help >"$tmp/out" 2>&1
    status=$?
    test "$status" -eq 0 && grep -q -- "-o OUT.png" "$tmp/out"
    ok $? "$tool --help exits 0 and describes -o: status $status"
done

# Bad files, named on one line, with no traceback (read before matplotlib
# is needed, so checked everywhere).
printf '{"traceEvents": 3}\n' >"$tmp/bad.json"
python3 "$tools/chorus-trace-plot" "$tmp/bad.json" -o "$tmp/bad.png" >"$tmp/out" 2>"$tmp/err"
status=$?
test "$status" -eq 1 && test "$(wc -l <"$tmp/err")" -eq 1 && grep -q 'bad.json is not a trace' "$tmp/err"
ok $? "chorus-trace-plot on a file that is not a trace exits 1 naming it: status $status, $(head -c 200 "$tmp/err" | tr '\n#' '  ')"

python3 "$tools/chorus-trace-plot" "$tmp/a.json" -o "$tmp/none.png" --steps 5:6 >"$tmp/out" 2>"$tmp/err"
status=$?
test "$status" -eq 2 && grep -q 'no steps 5 to 6 (it has steps 0 to 1)' "$tmp/err"
ok $? "--steps past the trace's steps exits 2 saying which it has: status $status, $(head -c 200 "$tmp/err" | tr '\n#' '  ')"

cat >"$tmp/log.jsonl" <<'EOF'
{"step":1,"epoch":0,"loss":2.3,"samples_per_s":1000.0,"devices":[{"id":"host","samples":40,"share":0.625,"time_s":0.01},{"id":"opencl:0","samples":24,"share":0.375,"time_s":0.01}]}

{"step":2,"epoch":0,"loss":null,"samples_per_s":1100.0,"tokens_per_s":70400.0,"val_loss":2.5,"devices":[{"id":"host","samples":40,"share":0.625,"time_s":0.01,"replicas_on_device":2},{"id":"host","samples":24,"share":0.375,"time_s":0.01,"replicas_on_device":2}],"breakdown":{"new":1}}
{"step":3,"epoch":1,"loss":1.9,"unknown":[1,2]}
EOF
{ cat "$tmp/log.jsonl"; echo '{"step":4,'; } >"$tmp/badlog.jsonl"
python3 "$tools/chorus-log-plot" "$tmp/badlog.jsonl" -o "$tmp/bad.png" >"$tmp/out" 2>"$tmp/err"
status=$?
test "$status" -eq 1 && test "$(wc -l <"$tmp/err")" -eq 1 && grep -q 'line 5 is not JSON' "$tmp/err"
ok $? "chorus-log-plot names the line that is not JSON and exits 1: status $status, $(head -c 200 "$tmp/err" | tr '\n#' '  ')"

# Without matplotlib (a stand-in that fails to import it, ahead of any
# installed one): one line saying how to install it, exit 1.
mkdir -p "$tmp/nompl/matplotlib"
echo 'raise ImportError("hidden by test-tools.sh")' >"$tmp/nompl/matplotlib/__init__.py"
for tool in chorus-trace-plot chorus-log-plot; do
    case $tool in
    chorus-trace-plot) input=$tmp/a.json ;;
    *) input=$tmp/log.jsonl ;;
    esac
    PYTHONPATH="$tmp/nompl" python3 "$tools/$tool" "$input" -o "$tmp/none.png" >"$tmp/out" 2>"$tmp/err"
    status=$?
    test "$status" -eq 1 && test "$(wc -l <"$tmp/err")" -eq 1 &&
        grep -q 'pip install matplotlib' "$tmp/err" && test ! -e "$tmp/none.png"
    ok $? "$tool without matplotlib exits 1 naming pip install matplotlib: status $status, $(head -c 200 "$tmp/err" | tr '\n#' '  ')"
done

# A PNG exists and starts with the PNG signature.
is_png() {
    test -s "$1" && python3 -c '
import sys
sys.exit(open(sys.argv[1], "rb").read(8) != b"\x89PNG\r\n\x1a\n")' "$1"
}

if python3 -c 'import matplotlib' >/dev/null 2>&1; then
    python3 "$tools/chorus-trace-plot" "$tmp/merged.json" -o "$tmp/trace.png" --title test 2>"$tmp/err"
    status=$?
    test "$status" -eq 0 && is_png "$tmp/trace.png"
    ok $? "chorus-trace-plot draws the merged trace into a PNG: status $status, $(wc -c <"$tmp/trace.png" 2>/dev/null) bytes, $(head -c 300 "$tmp/err" | tr '\n#' '  ')"

    python3 "$tools/chorus-trace-plot" "$tmp/a.json" -o "$tmp/step0.png" --steps 0:0 2>"$tmp/err"
    status=$?
    test "$status" -eq 0 && is_png "$tmp/step0.png"
    ok $? "chorus-trace-plot --steps 0:0 draws one step: status $status, $(head -c 300 "$tmp/err" | tr '\n#' '  ')"

    python3 "$tools/chorus-log-plot" "$tmp/log.jsonl" -o "$tmp/log.png" 2>"$tmp/err"
    status=$?
    test "$status" -eq 0 && is_png "$tmp/log.png"
    ok $? "chorus-log-plot draws the log into a PNG: status $status, $(wc -c <"$tmp/log.png" 2>/dev/null) bytes, $(head -c 300 "$tmp/err" | tr '\n#' '  ')"
else
    for what in "chorus-trace-plot draws a trace" "chorus-trace-plot --steps draws one step" \
        "chorus-log-plot draws a log"; do
        skip "matplotlib not installed ($what)"
    done
fi

tap_done
