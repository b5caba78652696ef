#!/bin/sh
# README.md as written: its quick-start training command runs (with a short
# limit appended) and prints a loss; its trace commands write a trace and
# draw it; its C example is examples/quick-start.c line for line, and that
# program runs; its test command is the one CI runs. Every relative link of
# README.md and docs/USAGE.md resolves (file and heading); every configure
# option USAGE.md names is one configure --help lists, and every option of
# its chorus-train section one chorus-train --help lists.
if ! command -v python3 >/dev/null 2>&1; then
    echo "1..0 # SKIP python3 is missing (it reads the Markdown)"
    exit 0
fi

srcdir=$(cd "${CHORUS_TEST_SRCDIR:-$(dirname "$0")/..}" && pwd)
builddir=${CHORUS_TEST_BUILDDIR:-.}
train=${CHORUS_TRAIN:-./utils/chorus-train}
case $train in /*) ;; *) train=$PWD/$train ;; esac
data=/usr/share/datasets/fashion-mnist
readme=$srcdir/README.md
usage=$srcdir/docs/USAGE.md
tmp=${TMPDIR:-/tmp}/test-readme.$$
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

. "$(dirname "$0")/tap.sh"

# The lines of the fenced block after README.md's "<!-- NAME" marker.
block() {
    awk -v m="<!-- $1" 'index($0, m) == 1 { f = 1; next }
        f == 1 && /^```/ { f = 2; next }
        f == 2 && /^```/ { exit }
        f == 2 { print }' "$readme"
}
have_data() {
    [ -r "$data/train-images-idx3-ubyte.gz" ] || [ -r "$data/train-images-idx3-ubyte" ]
}

# The quick start: its block's ./utils/chorus-train line, run by the shell
# as written with this build's chorus-train in place of ./utils/chorus-train
# and a short limit appended (20 steps of 64: one epoch of 1280 samples).
cmd=$(block quick-start | grep -m1 '^\./utils/chorus-train ')
test -n "$cmd"
ok $? "README.md's quick-start block has a line ./utils/chorus-train ..."
if [ -z "$cmd" ]; then
    skip "no quick-start command to run"
elif ! have_data; then
    skip "no Fashion-MNIST in $data (install dataset-fashion-mnist): the quick start is not run"
else
    eval "\"\$train\" ${cmd#./utils/chorus-train } --max-steps 20 --limit 1280" \
        >"$tmp/train.out" 2>"$tmp/train.err" </dev/null
    status=$?
    ok $status "the quick start runs: $cmd --max-steps 20 --limit 1280 (status $status; stderr: $(tail -c 300 "$tmp/train.err" | tr '\n#' '  '))"
    loss=$(sed -n 's/^result .*test_loss=\([0-9][0-9.]*\).*/\1/p' "$tmp/train.out")
    awk -v l="${loss:-x}" 'BEGIN { exit !(l ~ /^[0-9]+(\.[0-9]+)?$/ && l + 0 > 0) }'
    ok $? "it prints a loss: test_loss=${loss:-none} ($(head -c 200 "$tmp/train.out" | tr '\n#' '  '))"
fi

# The trace: its block's chorus-train line, as written, writes a trace, run
# in a folder of its own; the plot line draws it where matplotlib is
# installed.
trace_cmd=$(block trace | grep -m1 '^\./utils/chorus-train ')
plot_cmd=$(block trace | grep -m1 '^tools/chorus-trace-plot ')
test -n "$trace_cmd" && test -n "$plot_cmd"
ok $? "README.md's trace block has a chorus-train line and a tools/chorus-trace-plot line"
if [ -z "$trace_cmd" ] || ! have_data; then
    skip "no trace command, or no Fashion-MNIST in $data: the trace is not made"
else
    mkdir -p "$tmp/trace"
    (cd "$tmp/trace" && eval "\"\$train\" ${trace_cmd#./utils/chorus-train }" \
        >out 2>err </dev/null)
    status=$?
    python3 -c '
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
assert any(e.get("name", "").startswith("step") for e in events), "no step slices"
' "$tmp/trace/run.json" >"$tmp/trace/check" 2>&1
    ok $((status || $?)) "the trace command runs and writes run.json with its steps: $trace_cmd (status $status; $(cat "$tmp/trace/err" "$tmp/trace/check" | tail -c 300 | tr '\n#' '  '))"
    if [ -n "$plot_cmd" ] && python3 -c 'import matplotlib' 2>/dev/null; then
        (cd "$tmp/trace" && eval "\"\$srcdir/tools/chorus-trace-plot\" ${plot_cmd#tools/chorus-trace-plot }" \
            >plot.out 2>&1 </dev/null)
        status=$?
        test -s "$tmp/trace/run.png"
        ok $((status || $?)) "the plot command draws run.png (status $status; $(tail -c 300 "$tmp/trace/plot.out" | tr '\n#' '  '))"
    else
        skip "python3 has no matplotlib: the plot command is not run"
    fi
fi

# The C example: the README's ```c block is examples/quick-start.c from its
# #include on (the file's opening comment aside), and the program runs.
python3 - "$readme" "$srcdir/examples/quick-start.c" >"$tmp/example.diff" 2>&1 <<'EOF'
import difflib, sys
readme = open(sys.argv[1]).read().split("\n")
start = readme.index("```c") + 1
block = readme[start:readme.index("```", start)]
source = open(sys.argv[2]).read().rstrip("\n").split("\n")
source = source[next(i for i, l in enumerate(source) if l.startswith("#include")):]
diff = list(difflib.unified_diff(block, source, "README.md", "examples/quick-start.c", lineterm=""))
print("\n".join(diff) if diff else "the same lines")
sys.exit(1 if diff else 0)
EOF
ok $? "README.md's C example is examples/quick-start.c ($(head -c 400 "$tmp/example.diff" | tr '\n#\\' '   '))"
"$builddir/examples/quick-start" >"$tmp/example.out" 2>&1
status=$?
grep -Eq '^cnn on host: logits 64x10, the first -?[0-9]+\.[0-9]+$' "$tmp/example.out"
ok $((status || $?)) "examples/quick-start runs on the host (status $status: $(head -c 200 "$tmp/example.out" | tr '\n#' '  '))"

# The test command: CI (.ci/run) bootstraps, configures and runs make check
# as the README's line says.
line='./bootstrap && ./configure && make -j"$(nproc)" check'
grep -Fqx "$line" "$readme"
ok $? "README.md gives the test command: $line"
grep -q '^\./bootstrap ' "$srcdir/.ci/run" && grep -q 'make -j"\$jobs" check' "$srcdir/.ci/run"
ok $? ".ci/run runs ./bootstrap and make check, as the README's test command does"

# Links of README.md and docs/USAGE.md: every relative link's file exists,
# and a #heading in a Markdown file (or in the same file) is one of its
# headings, as GitHub names them.
for doc in README.md docs/USAGE.md; do
    python3 - "$srcdir" "$doc" >"$tmp/links.out" 2>&1 <<'EOF'
import os, re, sys
root, name = sys.argv[1], sys.argv[2]

def slugs(path):
    out, fenced = set(), False
    for line in open(path):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            text = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower().replace("`", ""))
            out.add(text.replace(" ", "-"))
    return out

text = re.sub(r"```.*?```", "", open(os.path.join(root, name)).read(), flags=re.S)
links = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'src="([^"]+)"', text)
bad, checked = [], 0
for link in links:
    if re.match(r"[a-z]+:", link):
        continue
    target, _, anchor = link.partition("#")
    path = os.path.join(root, os.path.dirname(name), target) if target else os.path.join(root, name)
    checked += 1
    if not os.path.exists(path):
        bad.append(link + " (no such file)")
    elif anchor and path.endswith(".md") and anchor not in slugs(path):
        bad.append(link + " (no such heading)")
print("%d links checked; broken: %s" % (checked, ", ".join(bad) or "none"))
sys.exit(1 if bad or not checked else 0)
EOF
    ok $? "$doc's links resolve: $(tr '\n#' '  ' <"$tmp/links.out")"
done

# docs/USAGE.md's options. Configure's: every --with-, --without-,
# --enable- and --disable- option outside its "Benchmarks and examples"
# section (which names bench_train.py's --with-compile); --without-X and
# --disable-X stand for --with-X and --enable-X.
"$srcdir/configure" --help >"$tmp/configure.help" 2>&1
ok $? "configure --help runs"
python3 - "$usage" "$tmp/configure.help" >"$tmp/configure.out" 2>&1 <<'EOF'
import re, sys
text = re.split(r"^## Benchmarks and examples$.*?(?=^## |\Z)", open(sys.argv[1]).read(),
                flags=re.M | re.S)
named = set(re.findall(r"--(?:with|without|enable|disable)-[a-z0-9-]*[a-z0-9]", "".join(text)))
listed = set(re.findall(r"--(?:with|enable|disable)-[a-z0-9-]*[a-z0-9]", open(sys.argv[2]).read()))
def known(opt):
    if opt.startswith("--without-"):
        return "--with-" + opt[10:] in listed
    if opt.startswith("--disable-") or opt.startswith("--enable-"):
        base = opt.split("-", 3)[3]
        return "--enable-" + base in listed or "--disable-" + base in listed
    return opt in listed
bad = sorted(o for o in named if not known(o))
print("%d named; not in configure --help: %s" % (len(named), ", ".join(bad) or "none"))
sys.exit(1 if bad or len(named) < 10 else 0)
EOF
ok $? "every configure option docs/USAGE.md names is configure's: $(tr '\n#' '  ' <"$tmp/configure.out")"

# chorus-train's: every --option in the section "## chorus-train".
"$train" --help >"$tmp/train.help" 2>&1
ok $? "chorus-train --help runs"
python3 - "$usage" "$tmp/train.help" >"$tmp/options.out" 2>&1 <<'EOF'
import re, sys
m = re.search(r"^## chorus-train$(.*?)(?=^## |\Z)", open(sys.argv[1]).read(), flags=re.M | re.S)
named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]", m.group(1) if m else ""))
listed = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]", open(sys.argv[2]).read()))
bad = sorted(named - listed)
print("%d named; not in chorus-train --help: %s" % (len(named), ", ".join(bad) or "none"))
sys.exit(1 if bad or len(named) < 20 else 0)
EOF
ok $? "every option of USAGE.md's chorus-train section is in chorus-train --help: $(tr '\n#' '  ' <"$tmp/options.out")"

tap_done
