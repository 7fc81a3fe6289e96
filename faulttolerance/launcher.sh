# The container's PID 1, run as root by the console's own static busybox:
#   /.console/bin/busybox sh -c "$LAUNCHER" launcher
# Nothing here runs a program of the job's image as root: that busybox is built
# "standalone", so every tool called here (awk, df, mv, nsenter...) is its own applet,
# whatever the image's PATH or files; the user's command runs as ma-user (uid 1000, no
# capabilities, no-new-privileges), so it can neither signal this process nor write
# where it reports.
#
# Trusted reports go to the control dir (/.console/run, a host folder the job can read
# but not write; jobs/runtime/engine.py), by names relative to it (the launcher works
# in it: a path the job renames later cannot redirect a report):
#   env-check           "pass" or "fail <item>: <detail>" (SPEC §5 checks, when MA_ENV_CHECKS=1)
#   exit-<attempt>      "<exit code> <1 if a process was OOM-killed, else 0>" when the user's
#                       process of that attempt ended
#   mounts              a standby's answer to "check": its nonce, then "<device> <inode>" of
#                       each path in "bind-targets" (step 1)
# and reads what the console writes there: "bind-targets", "check" and "go" (step 1),
# "decision" (step 3), the FIFO "wake".
# Log lines ("[env-check] ...", "[console] ...") say the same for people; the console
# never takes a fact from the log, which the job can print too.
#
# 0. Refuses (exit 87) an image that shadows the console's mounts with links: the tools,
#    the control dir, /cache and /etc/volcano must be mount points where they are named.
# 1. A standby (MA_STANDBY=1), started while the attempt before it runs, waits for the
#    console's "go" before anything below, answering its "check" of what is mounted where.
# 2. Pre-flight environment checks when MA_ENV_CHECKS=1: one `item` line per check; the
#    first failure is reported, prints `error,exiting` and exits 86.
# 3. Runs the user's command as a child. When it exits non-zero and process-level
#    restarts are possible (MA_PROCESS_RESTART=1), reports the exit and waits for the
#    supervisor's decision, which the console writes into the control dir ("decision"):
#    "restart N" runs the command again in this same container as attempt N (process-level
#    restart); anything else, or no answer in time, ends the container with the
#    command's exit code.
#    A decision can also come while the command still runs (another instance failed,
#    or this one hangs): the supervisor then sends SIGUSR1 and the launcher ends the
#    command (kill -KILL -1: every process but PID 1, so its daemons too) before running
#    it again. Only the launcher kills: it knows which run is the old one.
# docker stop's SIGTERM is forwarded to the child; the container then ends.

say() { echo "[console] $*"; }
item() { echo "[env-check] item: $1, result: $2${3:+, $3}"; }
refuse() { say "refused: $*"; exit 87; }

# Applets only (standalone busybox): with no PATH, a tool that is not an applet is not found.
PATH= awk 'BEGIN { exit 0 }' 2>/dev/null || refuse "the console's busybox is not a standalone build"
# Where the console mounted its tools, the control dir, /cache and /etc/volcano: an image
# with a link at one of these paths would have moved the mount where the job can reach it.
awk '$5 == "/.console/bin" { b++ } $5 == "/.console/run" { r++ } $5 == "/cache" { c = 1 }
     $5 == "/etc/volcano" { v = 1 } END { exit !(b && r && c && v) }' /proc/self/mountinfo ||
  refuse "the image has a link at /.console, /cache or /etc/volcano (the console's mounts): rebuild it without"
# Exactly one mount at the tools and at the control dir: a job's own mount whose target passes
# through a link it planted in a folder it writes (/data/x -> /.console, then /data/x/run) is
# made after the console's (Docker mounts by depth) and would cover it.
awk '$5 == "/.console/bin" { b++ } $5 == "/.console/run" { r++ } END { exit !(b == 1 && r == 1) }' \
  /proc/self/mountinfo || refuse "a mount of the job covers the console's tools or control dir"
workdir=$PWD
cd /.console/run || refuse "no control dir"

# The clock in hundredths of a second since boot, into $now (a builtin read: no fork).
now_cs() { read -r now _ </proc/uptime; now=${now%.*}${now#*.}; }

# report NAME TEXT: written whole (write, then rename), so a reader never sees half of it.
report() { echo "$2" >".$1.tmp" && mv -f ".$1.tmp" "$1"; }
fail_check() {
  item "$1" fail "$2"
  report env-check "fail $1: $2"
  echo "[env-check] error,exiting"
  exit 86
}

# Free space or size of a mount point in KB (POSIX df -P: 1024-blocks; size is column 2, available 4).
disk_kb() { df -Pk "$2" 2>/dev/null | awk -v col="$1" 'NR==2 { print $col }'; }

resolves() {
  grep -qE "(^|[[:space:]])$1([[:space:]]|\$)" /etc/hosts 2>/dev/null && return 0
  looks_up "$1"
}

# looks_up NAME: one question to the engine's resolver, given up after half a second. On the
# job's internal network the engine forwards a name it does not know (a peer not started yet)
# to servers that never answer, and busybox's nslookup waits 5 s for them: a peer that started
# and ended meanwhile (an attempt of two seconds) was never seen, and this host was isolated
# for it. A name the engine knows is answered at once.
looks_up() {
  nslookup "$1" >/dev/null 2>&1 &
  lookup=$!
  (sleep 0.5; kill "$lookup" 2>/dev/null) &
  guard=$!
  wait "$lookup" 2>/dev/null
  found=$?
  kill "$guard" 2>/dev/null
  return $found
}

check_dns() {
  names=""
  for f in /etc/volcano/*.host; do
    [ -f "$f" ] && names="$names $(cat "$f")"
  done
  # The other instances join the attempt's network as they start: a name gets a while to resolve.
  deadline=$(($(date +%s) + ${MA_CHECK_DNS_WAIT_S:-30}))
  for n in $names; do
    until resolves "$n"; do
      [ "$(date +%s)" -lt "$deadline" ] || fail_check dns "host name $n does not resolve"
      sleep 0.2
    done
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
  # Device nodes only: the engine puts them in /dev; the image's nvidia-smi is the job's program.
  count=$(ls /dev 2>/dev/null | grep -cE '^nvidia[0-9]+$')
  if [ "${count:-0}" -gt 0 ]; then
    item gpu-check pass "$count GPU device(s) visible"
  else
    fail_check gpu-check "no GPU is visible in the container"
  fi
}

# The FIFO "wake" of the control dir: the console writes a byte into it right after a decision,
# a go or a check (jobs/runtime/control.py wake), so a read on it returns at once. Held open only
# while waiting (no run inherits it), and opened before the first look for what is awaited, so a
# byte written after that look is never missed. The console makes it (make_control_dir); made
# here for a control dir from before.
open_wake() {
  [ -p wake ] || mkfifo -m 600 wake 2>/dev/null
  wake_fd=0
  if (: <>wake) 2>/dev/null; then exec 3<>wake; wake_fd=1; fi
}
# await_wake SECONDS: until a byte comes, a trapped signal ends the read, or SECONDS pass. Without
# the FIFO a wait, not a plain sleep: the supervisor's SIGUSR1 (a decision is written) ends a wait
# at once, where a foreground sleep would finish first.
await_wake() {
  if [ "$wake_fd" = 1 ]; then
    read -t "$1" -n 1 -u 3 wake_byte 2>/dev/null
  else
    sleep "$1" &
    wait $! 2>/dev/null
    kill $! 2>/dev/null
  fi
}
close_wake() { [ "$wake_fd" = 1 ] && exec 3<&-; }

# mounts_report NONCE: the device and inode of each path of "bind-targets" as seen here, in
# order, after the nonce the console asked with (one stat for all: a path not there has no line).
mounts_report() {
  nonce=$1
  set --
  if [ -f bind-targets ]; then
    while IFS= read -r target; do set -- "$@" "$target"; done <bind-targets
  fi
  { echo "$nonce"; [ $# -gt 0 ] && stat -L -c '%d %i' "$@" 2>/dev/null; } >.mounts.tmp
  mv -f .mounts.tmp mounts
}

# 1. A standby (jobs/runtime/standby.py; MA_STANDBY=1, set by the console) is started while the
# attempt before it still runs, and runs nothing until the console writes "go". Before the go the
# console asks ("check", with a nonce) what is mounted where, and compares the answer ("mounts")
# with the sources as they are now: a bind mount holds the folder it was started with. The checks
# and the job run after the go, as in any container. A standby no restart takes is removed; a
# docker stop ends the wait.
#
# From here until the job's run has its own handler: docker stop's SIGTERM ends the launcher. A
# PID 1 ignores a signal it has no handler for, and the dns check may wait 30 s for the other
# instances' names: without this, a stop meanwhile waited for Docker's SIGKILL.
trap 'exit 143' TERM INT
if [ "${MA_STANDBY:-0}" = 1 ]; then
  open_wake
  until [ -f go ]; do
    if mv -f check .check.taken 2>/dev/null; then
      mounts_report "$(cat .check.taken)"
      continue
    fi
    await_wake 5
  done
  close_wake
fi
unset MA_STANDBY

# What the job may write but not change: /cache is ma-user's (a fresh volume's root is
# root's), /etc/volcano (root's tmpfs) holds the instance host names for the dns check.
chown -h 1000:1000 /cache 2>/dev/null
if [ -n "${MA_VOLCANO_HOSTS:-}" ]; then
  for n in $MA_VOLCANO_HOSTS; do echo "$n"; done >"/etc/volcano/${MA_JOB_NAME:-job}.host"
fi

if [ "${MA_ENV_CHECKS:-0}" = 1 ]; then
  check_dns
  check_disk root / "${MA_CHECK_ROOT_GB:-32}" free
  check_disk shm /dev/shm "${MA_CHECK_SHM_GB:-1}" size
  check_disk cache /cache "${MA_CHECK_CACHE_GB:-32}" free
  [ "${MA_CHECK_ULIMIT:-0}" = 1 ] && check_ulimit
  [ "${MA_CHECK_GPU:-0}" = 1 ] && check_gpu
  report env-check pass
fi

# The kernel's count of OOM kills in this container's cgroup (v1 or v2): a child killed
# for memory leaves the container alive, so Docker's OOMKilled flag stays false.
oom_kills() {
  awk '/^oom_kill / { print $2; exit }' /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events \
    2>/dev/null || echo 0
}

# The apps the job asked for (MA_APPS, set by the console): JupyterLab, TensorBoard, started beside
# each run as ma-user on the instance's loopback, where only the console's relay reaches them
# (jobs/proxy/). A new run starts them again: the previous run's kill took them too.
start_apps() {
  for app in ${MA_APPS:-}; do
    case "$app" in
      jupyter) bin=jupyter name=JupyterLab where="the notebook preset image has it"
        cmd='exec jupyter lab --ip=127.0.0.1 --port=8888 --no-browser --ServerApp.token= --ServerApp.password= --ServerApp.allow_remote_access=True --ServerApp.allow_origin="*" --ServerApp.root_dir="$HOME"' ;;
      tensorboard) bin=tensorboard name=TensorBoard where="the notebook preset image has it"
        cmd='exec tensorboard --logdir "${MA_SUMMARY_DIR:-$HOME}" --host 127.0.0.1 --port 6006' ;;
      # The image's sshd as ma-user (it can log in only ma-user), with the job's host key and the
      # user's authorized_keys, both written by the console; -f /dev/null: no config of the image's.
      sshd) bin=/usr/sbin/sshd name="SSH remote development" where="the python and notebook preset images have it"
        cmd='exec /usr/sbin/sshd -D -e -f /dev/null -o ListenAddress=127.0.0.1 -o Port="$MA_SSHD_PORT" -o HostKey="$MA_SSH_HOST_KEY" -o AuthorizedKeysFile=.ssh/authorized_keys -o UsePAM=no -o PidFile=none -o PasswordAuthentication=no -o KbdInteractiveAuthentication=no -o X11Forwarding=no -o "Subsystem=sftp internal-sftp"' ;;
      *) continue ;;
    esac
    # Looked up as the user's shell would, on the image's PATH (the image's program, run as ma-user).
    if ! nsenter -F -S 1000 -G 1000 /bin/sh -c "command -v $bin" >/dev/null 2>&1; then
      say "$name: '$bin' is not in this image ($where)"
      continue
    fi
    (cd "$workdir" 2>/dev/null; exec nsenter -F -S 1000 -G 1000 /bin/sh -c "$cmd >/tmp/.console-$app.log 2>&1") &
  done
}

# Ends every process of the previous run (kill -KILL -1: all but PID 1) and waits until they
# are gone, at most 2 s: a process being killed still holds its ports and GPU memory for a
# moment, and a killed daemon (reparented to this shell) stays a zombie, its PID alive to
# `kill -0`, until this shell reaps it, which its next `wait` does. Only the processes that
# were there are waited for: an exec started meanwhile (a terminal) is not the old run.
end_previous_run() {
  before=""
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = 1 ] || [ "$p" = "$$" ] || before="$before $p"
  done
  kill -KILL -1 2>/dev/null
  tick=0
  while [ -n "$before" ] && [ "$tick" -lt 400 ]; do
    sleep 0.005 &
    wait $! 2>/dev/null
    alive=""
    for p in $before; do [ -d "/proc/$p" ] && alive="$alive $p"; done
    before=$alive
    tick=$((tick + 1))
  done
}

stopping=0
child=0
trap 'signalled=1; stopping=1; [ "$child" -gt 0 ] && kill -TERM "$child" 2>/dev/null' TERM INT
trap 'signalled=1' USR1  # a decision was written: a handler, so that it interrupts wait
run=0
while :; do
  run=$((run + 1))
  if [ "$run" -gt 1 ]; then
    # Nothing of the previous run survives into this one (its daemons hold GPUs and ports).
    end_previous_run
    # The supervisor's follower starts the new run's log at this line (it names the attempt).
    say "process restarted in the same container (run $run, attempt $MA_ATTEMPT)"
  fi
  export MA_PROCESS_RUN=$run
  start_apps
  ooms_before=$(oom_kills)
  # As ma-user, with no supplementary groups, in the image's working dir; the image's own
  # /bin/sh (by its path: the applet would be busybox's shell).
  (cd "$workdir" 2>/dev/null; exec nsenter -F -S 1000 -G 1000 /bin/sh -c "$MA_USER_COMMAND") &
  child=$!
  # wait returns early (128 + the signal) when a trapped signal arrives: wait again until it
  # returns the child's own status. Not "until the child is gone": a short run that ended
  # while the signal cut the wait short would be reported as killed by SIGUSR1 (138).
  code=""
  while :; do
    # A decision while the command runs ends it (checked before every wait: the signal may
    # have come before this one started, even before the first run). A decision is taken
    # (moved away) only once the run it ends is over, so this never ends a run started for it.
    [ -f decision ] && kill -KILL -1 2>/dev/null
    signalled=0
    # 2>/dev/null: the shell's own "Killed" notice for a child it reaps goes to stderr, which
    # Docker may log after the exit marker written on stdout (two pipes): read as the next
    # run's first line. The code says how the child ended.
    wait "$child" 2>/dev/null
    status=$?
    # 127 after a first answer: the signal came just after a wait that had the child's status.
    [ "$status" = 127 ] && [ -n "$code" ] && break
    code=$status
    [ "$signalled" = 1 ] || break
  done
  child=0
  oom=0
  [ "$(oom_kills)" != "$ooms_before" ] && oom=1
  report "exit-$MA_ATTEMPT" "$code $oom"
  if [ "$code" -eq 0 ] || [ "$stopping" = 1 ] || [ "${MA_PROCESS_RESTART:-0}" != 1 ]; then
    exit "$code"
  fi
  [ "$oom" = 1 ] && oomtext=" (oom-killed)" || oomtext=""
  say "process exited with code $code$oomtext; waiting for the supervisor's decision"
  # Woken through the FIFO (open_wake): the SIGUSR1 that follows a decision comes ~14 ms later
  # (Docker's kill call).
  open_wake
  # Bounded by the clock, not by a count of polls: ash starts `read -t` again from the top on
  # every signal it has no trap for, and the job's own orphans (reparented to this shell) send
  # SIGCHLD as often as it likes (one read of 50 ms took minutes). With a trap, a SIGCHLD ends
  # the read; the loop looks again and goes on until the deadline.
  trap ':' CHLD
  now_cs
  deadline=$((now + ${MA_DECISION_TIMEOUT_S:-30} * 100))
  decision=""
  while :; do
    # Taken whole: a newer decision written meanwhile is not lost with this one.
    if mv -f decision .decision.taken 2>/dev/null; then
      decision=$(cat .decision.taken)
      break
    fi
    [ "$stopping" = 1 ] && break
    now_cs
    [ "$now" -lt "$deadline" ] || break
    await_wake "${MA_DECISION_POLL_S:-0.05}"
  done
  trap - CHLD
  close_wake
  case "$decision" in
    "restart "*) MA_ATTEMPT=${decision#restart }; MA_RESTART_COUNT=$((MA_ATTEMPT - 1)) ;;
    *) exit "$code" ;;
  esac
  export MA_ATTEMPT MA_RESTART_COUNT
done
