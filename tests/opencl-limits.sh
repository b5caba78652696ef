#!/bin/sh
# The OpenCL op tests on devices made smaller than they are: the backend's
# test caps (CHORUS_OPENCL_MAX_WORK_GROUP, CHORUS_OPENCL_LOCAL_MEM, read at
# ch_init) lower every device's largest work-group and its local memory,
# so the kernels take the paths a small device gets. Three shapes of
# device, each through op tests at their small sizes:
# - work-groups of 16 and 1 KiB of local memory: reductions in groups of
#   16, the GEMM without local memory (gemm_simple); every op test;
# - work-groups of 48, not a power of two: 1-D launches of 48 (or the
#   kernel's preferred multiple below it), reductions of 32, the GEMM of
#   4 x 4 work-items;
# - work-groups of 128 and 6 KiB: the GEMM of 8 x 8 where a product needs
#   more than one tile of 32, reductions of 128.
# (Uncapped, auto takes CLBlast where the build has it; under a cap, our
# kernels.) Then values the backend must refuse, saying why. One TAP
# stream: each program's lines renumbered, named by the caps they ran
# under.
. "$(dirname "$0")/tap.sh"

# work-group, local memory (- for the device's), programs
configs='
16   1024  test-ops test-ops-attn test-ops-norm test-half
48   -     test-ops test-ops-attn test-ops-norm
128  6144  test-ops-attn test-ops-norm
'

# Runs `prog` under the caps and copies its TAP lines into ours, each
# claim prefixed with the caps; a skipped program (no OpenCL device) is a
# skip here. The program's own plan and exit status must agree with it.
run_capped() {
    wg=$1 lmem=$2 prog=$3
    if [ "$lmem" = - ]; then
        label="[work-groups of $wg] $prog"
    else
        label="[work-groups of $wg, $lmem bytes of local memory] $prog"
    fi
    out=$(
        if [ "$lmem" = - ]; then
            CHORUS_OPENCL_MAX_WORK_GROUP=$wg CHORUS_TEST_SIZES=small "./tests/$prog" 2>&1 </dev/null
        else
            CHORUS_OPENCL_MAX_WORK_GROUP=$wg CHORUS_OPENCL_LOCAL_MEM=$lmem \
                CHORUS_TEST_SIZES=small "./tests/$prog" 2>&1 </dev/null
        fi
        echo "exit $?"
    )
    status=$(printf '%s\n' "$out" | sed -n 's/^exit \([0-9]*\)$/\1/p' | tail -1)
    if printf '%s\n' "$out" | grep -q '^1\.\.0 # SKIP'; then
        skip "$label: $(printf '%s\n' "$out" | sed -n 's/^1\.\.0 # SKIP //p')"
        return
    fi
    planned=$(printf '%s\n' "$out" | sed -n 's/^1\.\.\([0-9]*\)$/\1/p' | tail -1)
    count=0
    # The lines as ok/skip/not ok; a here-document keeps the counters in
    # this shell.
    while IFS= read -r line; do
        case $line in
        "ok "*"# SKIP"*)
            count=$((count + 1))
            skip "$label: ${line#*# SKIP }" ;;
        "ok "*)
            count=$((count + 1))
            ok 0 "$label: ${line#ok * - }" ;;
        "not ok "*)
            count=$((count + 1))
            ok 1 "$label: ${line#not ok * - }" ;;
        "#"*)
            echo "$line" ;;
        esac
    done <<EOF
$out
EOF
    ok "$([ "$status" = 0 ] && [ "$count" = "$planned" ] && echo 0 || echo 1)" \
        "$label: exit status ${status:-none} (0), $count lines of ${planned:-no} plan"
}

list=${TMPDIR:-/tmp}/opencl-limits.$$
trap 'rm -f "$list"' EXIT
printf '%s\n' "$configs" | while read -r wg lmem programs; do
    [ -n "$wg" ] || continue
    for prog in $programs; do
        echo "$wg $lmem $prog"
    done
done > "$list"
while read -r wg lmem prog; do
    run_capped "$wg" "$lmem" "$prog"
done < "$list"

# Values that are not a count: the backend is unavailable, and says why.
for bad in CHORUS_OPENCL_MAX_WORK_GROUP=0 CHORUS_OPENCL_MAX_WORK_GROUP=16x \
    CHORUS_OPENCL_MAX_WORK_GROUP=-1 CHORUS_OPENCL_LOCAL_MEM=abc \
    CHORUS_OPENCL_LOCAL_MEM=99999999999999999999; do
    info=$(env "$bad" ./utils/chorus-info 2>&1)
    printf '%s\n' "$info" | grep -q "^ *opencl *unavailable.*${bad%%=*}=${bad#*=}: expected a number"
    ok $? "$bad: the OpenCL backend is unavailable, naming the variable and its value"
done
tap_done
