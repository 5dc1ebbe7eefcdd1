# Process bookkeeping for the scripts that run cluster processes on
# loopback (scripts/interop-flodl, scripts/real-ranks-smoke), sourced by
# them: every background process is a group leader of its own (setsid), and
# only those groups are ever signalled; waits are bounded polls. The caller
# sets its own traps (`trap cleanup EXIT`).
PGIDS=()
BG_PID=""

# start_bg LOGBASE LIMIT_SECS CMD... : run CMD under `timeout LIMIT` in a new
# session, stdout/stderr to LOGBASE.out/.err; sets BG_PID (= its pgid).
start_bg() {
    local log=$1 limit=$2
    shift 2
    setsid timeout -k 3 "$limit" "$@" >"$log.out" 2>"$log.err" </dev/null &
    BG_PID=$!
    PGIDS+=("$BG_PID")
}

stop_group() {
    local pg=$1
    kill -0 -- "-$pg" 2>/dev/null || return 0
    kill -TERM -- "-$pg" 2>/dev/null
    for _ in $(seq 30); do
        kill -0 -- "-$pg" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL -- "-$pg" 2>/dev/null
}

cleanup() {
    local pg
    for pg in "${PGIDS[@]}"; do stop_group "$pg"; done
    PGIDS=()
}

# wait_for_line FILE PATTERN SECS [PID]: bounded poll for a fixed string in a
# log; gives up early when PID (if given) has exited and the line is absent.
wait_for_line() {
    local file=$1 pattern=$2 secs=$3 pid=${4:-}
    local deadline=$((SECONDS + secs))
    while [ $SECONDS -lt $deadline ]; do
        grep -qF -- "$pattern" "$file" 2>/dev/null && return 0
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
            grep -qF -- "$pattern" "$file" 2>/dev/null
            return
        fi
        sleep 0.1
    done
    return 1
}

# count_re FILE... -- ERE: lines matching an extended regex, over files.
count_re() {
    local re=$1
    shift
    cat "$@" 2>/dev/null | grep -cE -- "$re"
}

# wait_for_count N SECS ERE FILE...: bounded poll until N lines match.
wait_for_count() {
    local n=$1 secs=$2 re=$3
    shift 3
    local deadline=$((SECONDS + secs))
    while [ $SECONDS -lt $deadline ]; do
        [ "$(count_re "$re" "$@")" -ge "$n" ] && return 0
        sleep 0.05
    done
    return 1
}

# wait_exit PID SECS: wait for a process we started, bounded; sets WAIT_RC
# to its exit status, or to "timeout" after stopping its group. (Not meant
# for $(...): `wait` only works in the shell that started the process.)
WAIT_RC=""
wait_exit() {
    local pid=$1 secs=$2
    local deadline=$((SECONDS + secs))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        stop_group "$pid"
        wait "$pid" 2>/dev/null
        WAIT_RC=timeout
    else
        wait "$pid" 2>/dev/null
        WAIT_RC=$?
    fi
}
