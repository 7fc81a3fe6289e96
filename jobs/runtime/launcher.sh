# The container's PID 1 (run as `sh -c "$LAUNCHER" launcher`): POSIX sh only,
# so it works in any image that has /bin/sh.
#
# 1. Pre-flight environment checks (SPEC §5) when MA_ENV_CHECKS=1: one `item`
#    line per check; the first failure prints `error,exiting` and exits 86.
# 2. Runs the user's command ($MA_USER_COMMAND) as a child. When it exits
#    non-zero and process-level restarts are possible (MA_PROCESS_RESTART=1),
#    prints a marker line and waits for the supervisor's decision, which it
#    writes with `docker exec` into $MA_CONTROL_DIR/decision:
#    "restart N" runs the command again in this same container as attempt N
#    (process-level restart); anything else, or no answer in time, ends the
#    container with the command's exit code.
#    A decision can also come while the command still runs (another instance
#    failed, or this one hangs): the supervisor then sends SIGUSR1 and the
#    launcher ends the command (kill -KILL -1: every process but PID 1, so
#    its daemons too) before running it again. Only the launcher kills: it
#    knows which run is the old one, and it has no helper running then.
# docker stop's SIGTERM is forwarded to the child; the container then ends.

say() { echo "[console] $*"; }
item() { echo "[env-check] item: $1, result: $2${3:+, $3}"; }
fail_check() { item "$1" fail "$2"; echo "[env-check] error,exiting"; exit 86; }

# Free space or size of a mount point in KB (POSIX df -P: 1024-blocks; size is column 2, available 4).
disk_kb() { df -Pk "$2" 2>/dev/null | awk -v col="$1" 'NR==2 { print $col }'; }

resolves() {
  grep -qE "(^|[[:space:]])$1([[:space:]]|\$)" /etc/hosts 2>/dev/null && return 0
  command -v getent >/dev/null 2>&1 && getent hosts "$1" >/dev/null 2>&1 && return 0
  command -v nslookup >/dev/null 2>&1 && nslookup "$1" >/dev/null 2>&1 && return 0
  return 1
}

check_dns() {
  names=""
  for f in /etc/volcano/*.host; do
    [ -f "$f" ] && names="$names $(cat "$f")"
  done
  for n in $names; do
    resolves "$n" || fail_check dns "host name $n does not resolve"
  done
  item dns pass "$(echo $names | wc -w | tr -d ' ') host names resolve"
}

check_disk() {  # name path minimum-GB measure(free|size)
  if [ "$4" = size ]; then kb=$(disk_kb 2 "$2"); else kb=$(disk_kb 4 "$2"); fi
  [ -n "$kb" ] || fail_check "disk-size $1" "$2 is not mounted"
  got=$(awk -v kb="$kb" 'BEGIN { printf "%.1f", kb / 1048576 }')
  awk -v kb="$kb" -v min="$3" 'BEGIN { exit !(kb > min * 1048576) }' ||
    fail_check "disk-size $1" "$2 has $got GB $4, needs more than $3 GB"
  item "disk-size $1" pass "$2 has $got GB $4 (> $3 GB)"
}

check_ulimit() {
  for spec in "l:max locked memory:$MA_CHECK_ULIMIT_MEMLOCK" "n:open files:$MA_CHECK_ULIMIT_NOFILE" \
              "s:stack size:$MA_CHECK_ULIMIT_STACK" "u:max user processes:$MA_CHECK_ULIMIT_NPROC"; do
    flag=${spec%%:*}; rest=${spec#*:}; label=${rest%%:*}; min=${rest#*:}
    got=$(ulimit -"$flag" 2>/dev/null)
    [ "$got" = unlimited ] && continue
    [ -n "$got" ] && [ "$got" -gt "$min" ] || fail_check ulimit "$label is ${got:-unknown}, needs more than $min"
  done
  item ulimit pass "limits above the thresholds"
}

check_gpu() {
  if ls /dev/nvidia[0-9]* >/dev/null 2>&1 || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
    item gpu-check pass "$(ls /dev/nvidia[0-9]* 2>/dev/null | wc -l | tr -d ' ') GPU device(s) visible"
  else
    fail_check gpu-check "no GPU is visible in the container"
  fi
}

# The instance host names of the job, for the dns check (and for the user).
if [ -n "${MA_VOLCANO_HOSTS:-}" ] && [ -d /etc/volcano ] && [ -w /etc/volcano ]; then
  for n in $MA_VOLCANO_HOSTS; do echo "$n"; done >"/etc/volcano/${MA_JOB_NAME:-job}.host"
fi

if [ "${MA_ENV_CHECKS:-0}" = 1 ]; then
  check_dns
  check_disk root / "${MA_CHECK_ROOT_GB:-32}" free
  check_disk shm /dev/shm "${MA_CHECK_SHM_GB:-1}" size
  check_disk cache /cache "${MA_CHECK_CACHE_GB:-32}" free
  [ "${MA_CHECK_ULIMIT:-0}" = 1 ] && check_ulimit
  [ "${MA_CHECK_GPU:-0}" = 1 ] && check_gpu
fi

# The kernel's count of OOM kills in this container's cgroup (v1 or v2): a
# child killed for memory leaves the container alive, so Docker's OOMKilled
# flag stays false; the launcher reports it instead.
oom_kills() {
  awk '/^oom_kill / { print $2; exit }' /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events \
    2>/dev/null || echo 0
}

control=${MA_CONTROL_DIR:-/tmp/.console}
mkdir -p "$control" 2>/dev/null
stopping=0
child=0
trap 'stopping=1; [ "$child" -gt 0 ] && kill -TERM "$child" 2>/dev/null' TERM INT
trap ': a decision was written' USR1  # a handler, so that it interrupts wait
run=0
while :; do
  run=$((run + 1))
  rm -f "$control/decision"
  # The supervisor's follower starts the new run's log at this line (it names the attempt).
  [ "$run" -gt 1 ] && say "process restarted in the same container (run $run, attempt $MA_ATTEMPT)"
  export MA_PROCESS_RUN=$run
  ooms_before=$(oom_kills)
  sh -c "$MA_USER_COMMAND" &
  child=$!
  echo "$child" >"$control/child.pid"
  # wait returns early when a trapped signal arrives: wait until the child is gone.
  while :; do
    # A decision while the command runs ends it (checked before every wait: the
    # signal may have come before this one started). The decision is removed only
    # before a new run starts, so this never ends a run started for it.
    [ -f "$control/decision" ] && kill -KILL -1 2>/dev/null
    wait "$child"
    code=$?
    kill -0 "$child" 2>/dev/null || break
  done
  child=0
  if [ "$code" -eq 0 ] || [ "$stopping" = 1 ] || [ "${MA_PROCESS_RESTART:-0}" != 1 ]; then
    exit "$code"
  fi
  oom=""
  [ "$(oom_kills)" != "$ooms_before" ] && oom=" (oom-killed)"
  say "process exited with code $code$oom; waiting for the supervisor's decision"
  waited=0
  decision=""
  while [ "$waited" -lt "${MA_DECISION_TIMEOUT_TICKS:-600}" ]; do
    if [ -f "$control/decision" ]; then
      decision=$(cat "$control/decision")
      break
    fi
    [ "$stopping" = 1 ] && break
    sleep 0.05
    waited=$((waited + 1))
  done
  case "$decision" in
    "restart "*) MA_ATTEMPT=${decision#restart }; MA_RESTART_COUNT=$((MA_ATTEMPT - 1)) ;;
    *) exit "$code" ;;
  esac
  export MA_ATTEMPT MA_RESTART_COUNT
done
