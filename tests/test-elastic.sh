#!/bin/sh
# chorus-elastic without MPI: a launcher of our own (env N={n}) runs a
# program that records its arguments and fails until a given run. The
# restarts count down the processes to --min, add --resume FILE in place
# of the program's own, stop after K, and leave alone what a restart
# would not change; bad options exit 2. (test-dist.sh runs it under
# mpirun with a rank killed.)
srcdir=${CHORUS_TEST_SRCDIR:-$(dirname "$0")/..}
elastic=$srcdir/utils/chorus-elastic
tmp=${TMPDIR:-/tmp}/test-elastic.$$
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

. "$(dirname "$0")/tap.sh"

# The job: appends "N=<processes>[arg][arg]..." to $RUNS, then exits
# $FAIL_WITH until the run numbered $SUCCEED_AT (0: never).
cat >"$tmp/job.sh" <<'SH'
#!/bin/sh
printf 'N=%s' "$N" >>"$RUNS"
printf '[%s]' "$@" >>"$RUNS"
echo >>"$RUNS"
runs=$(wc -l <"$RUNS")
[ "$SUCCEED_AT" -ne 0 ] && [ "$runs" -ge "$SUCCEED_AT" ] && exit 0
exit "$FAIL_WITH"
SH
chmod +x "$tmp/job.sh"
RUNS="$tmp/runs"
export RUNS

# One supervised job: FAIL_WITH, SUCCEED_AT, then chorus-elastic's words.
job() {
    rm -f "$RUNS"
    FAIL_WITH=$1 SUCCEED_AT=$2
    export FAIL_WITH SUCCEED_AT
    shift 2
    "$elastic" --launcher "env N={n}" "$@" >"$tmp/out" 2>"$tmp/err"
}

touch "$tmp/ck.st"
job 1 3 -n 3 --restarts 5 -- "$tmp/job.sh" --resume old.st --checkpoint "$tmp/ck.st" "a b"
status=$?
{
    echo "N=3[--resume][old.st][--checkpoint][$tmp/ck.st][a b]"
    echo "N=2[--checkpoint][$tmp/ck.st][a b][--resume][$tmp/ck.st]"
    echo "N=1[--checkpoint][$tmp/ck.st][a b][--resume][$tmp/ck.st]"
} >"$tmp/want"
test $status -eq 0 && cmp -s "$tmp/want" "$RUNS" &&
    grep -q "run 1 on 3 processes ended with exit 1 after [0-9]*s; restart 1 of 5 on 2 processes, resuming from $tmp/ck.st" "$tmp/err" &&
    grep -q "run 3 on 1 processes ended with exit 0 .*(2 restart(s))" "$tmp/err"
ok $? "a job failing twice: 3, 2 then 1 processes, each restart resuming from the checkpoint in place of the given --resume, exit 0 ($(tr '\n' ' ' <"$RUNS"))"

job 1 0 -n 4 --min 3 --restarts 2 -- "$tmp/job.sh" --checkpoint="$tmp/ck.st"
status=$?
test $status -eq 1 && [ "$(cut -d'[' -f1 "$RUNS" | tr '\n' ' ')" = "N=4 N=3 N=3 " ] &&
    grep -q "\[--resume\]\[$tmp/ck.st\]" "$RUNS"
ok $? "--min 3 --restarts 2: runs on 4, 3 and 3 processes, then the last run's status (exit $status)"

rm -f "$tmp/none.st"
job 9 2 -n 2 -- "$tmp/job.sh" --checkpoint "$tmp/none.st"
test $? -eq 0 && ! grep -q -- "--resume" "$RUNS" && grep -q "from the start (no checkpoint was written)" "$tmp/err"
ok $? "no checkpoint written yet: the restart starts over, without --resume"

for code in 2 130 143 127; do
    job "$code" 0 -n 2 --restarts 3 -- "$tmp/job.sh" --checkpoint "$tmp/ck.st"
    status=$?
    test $status -eq "$code" && [ "$(wc -l <"$RUNS")" -eq 1 ] && ! grep -q restart "$tmp/err"
    ok $? "a run ending with exit $code is not restarted (exit $status)"
done

job 1 0 --restarts 0 -- "$tmp/job.sh" --checkpoint "$tmp/ck.st"
test $? -eq 1 && [ "$(wc -l <"$RUNS")" -eq 1 ]
ok $? "--restarts 0: one run"

bad() {
    want=$1
    shift
    "$elastic" "$@" >/dev/null 2>"$tmp/err"
    status=$?
    test $status -eq 2 && grep -q -- "$want" "$tmp/err"
    ok $? "chorus-elastic $*: exit 2, \"$(head -1 "$tmp/err")\""
}
bad "no --checkpoint FILE" -n 2 -- "$tmp/job.sh" --resume x
bad "wants a whole number >= 1" -n 0 -- "$tmp/job.sh" --checkpoint c
bad "wants a whole number >= 0" --restarts -1 -- "$tmp/job.sh" --checkpoint c
bad "is more than the 2 processes" -n 2 --min 3 -- "$tmp/job.sh" --checkpoint c
bad "has no {n}" --launcher "mpirun" -- "$tmp/job.sh" --checkpoint c
bad "unknown option --bogus" --bogus -- "$tmp/job.sh" --checkpoint c
bad "no program to run" -n 2
bad "needs a value" -n
"$elastic" --help | grep -q "usage: chorus-elastic"
ok $? "--help prints the usage"

tap_done
