#!/usr/bin/env bash
# start-local-slurm.sh - install, configure and start a real single-node Slurm
# cluster on Debian 12 (bookworm), without systemd, for embedfleet's tests
# (orchestrator/tests/scheduler_*.rs; .ci/run calls this script).
# Adapted from the team's shared/slurm/start-local-slurm.sh; the project owns
# this copy.  Installs slurm-wlm (+ slurmctld, slurmd, munge) and
# slurm-wlm-torque (qsub/qstat/qdel over Slurm).
#
#   munged, [mariadbd + slurmdbd], slurmctld and slurmd are started by hand;
#   their pid files, state, logs and database live under $SLURM_TEST_DIR.
#   Client configs go where the tools look by default: /etc/slurm/slurm.conf,
#   /etc/slurm/slurmdbd.conf, /etc/slurm/plugstack.conf.d/pbs.conf.
#
# Idempotent: if the cluster is already up it only prints how to use it.
# Must run as root.  Stop it with stop-local-slurm.sh (next to this file).
#
# Settings (environment variables):
#   SLURM_TEST_DIR=/tmp/slurm-test   state, logs, pid files, MariaDB data
#   SLURM_TEST_ACCOUNTING=1          1: slurmdbd + MariaDB, so sacct works
#                                    0: no accounting; sacct then fails with
#                                       "Slurm accounting storage is disabled"
#   SLURM_TEST_PARTITIONS="debug gpu rehearsal" partitions (all on the one
#                                    node); the first one is the default
#                                    partition; `rehearsal` is drained by the
#                                    reduced rehearsal test, and no other
#                                    test submits to it
#   SLURM_TEST_CPUS=                 advertise this many CPUs instead of the
#                                    real count (uses config_overrides); the
#                                    default is the real count, but at least 8,
#                                    so that 8 one-CPU jobs run at once even
#                                    on a 2-core CI machine
#   SLURM_TEST_MEMORY=               RealMemory in MB (default 90% of real)
#   SLURM_TEST_MIN_JOB_AGE=300       seconds a finished job stays visible in
#                                    squeue/scontrol (+ up to ~60 s purge lag)
#   SLURM_TEST_CGROUP=0              1: proctrack/cgroup + task/cgroup
#                                    (--mem enforced, OOM -> OUT_OF_MEMORY)
#   SLURM_TEST_KEEP_STATE=0          1: keep jobs, job ids and accounting data
#                                    from the previous run (default: fresh)
#   SLURM_TEST_DB_PORT=3316          TCP port of the private MariaDB (127.0.0.1)
#   SLURM_TEST_SCHED_PARAMS=batch_sched_delay=0
#                                    slurm.conf SchedulerParameters; Slurm's
#                                    default batch_sched_delay=3 makes a new
#                                    batch job wait up to 3 s before it starts
#
# Runs from / whatever the caller's working directory: the daemons it starts keep the one they
# are started in, and one that is deleted or that `munge`/`mysql` cannot read must not matter.
set -euo pipefail
# shellcheck source=../lib/err.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/err.sh"

DIR=${SLURM_TEST_DIR:-/tmp/slurm-test}
ACCOUNTING=${SLURM_TEST_ACCOUNTING:-1}
PARTITIONS=${SLURM_TEST_PARTITIONS:-debug gpu rehearsal}
CPUS_OVERRIDE=${SLURM_TEST_CPUS:-}
MEM_OVERRIDE=${SLURM_TEST_MEMORY:-}
MIN_JOB_AGE=${SLURM_TEST_MIN_JOB_AGE:-300}
CGROUP=${SLURM_TEST_CGROUP:-0}
KEEP_STATE=${SLURM_TEST_KEEP_STATE:-0}
DB_PORT=${SLURM_TEST_DB_PORT:-3316}
SCHED_PARAMS=${SLURM_TEST_SCHED_PARAMS:-batch_sched_delay=0}
DB_PASS=slurmtestpw

RUN=$DIR/run
LOG=$DIR/log
STATE=$DIR/state
DBDIR=$DIR/mysql
CONF=/etc/slurm/slurm.conf
DBDCONF=/etc/slurm/slurmdbd.conf
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd /

say() { printf '[start-local-slurm] %s\n' "$*"; }
die() { printf '[start-local-slurm] ERROR: %s\n' "$*" >&2; exit 1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

[ "$(id -u)" = 0 ] || die "must run as root"

# ---------------------------------------------------------------- helpers
# alive NAME PID: PID is a live (non-zombie) process whose comm is NAME
alive() {
  local name=$1 pid=${2:-} s
  [[ $pid =~ ^[0-9]+$ ]] && [ -r "/proc/$pid/stat" ] || return 1
  s=$(sed -n 's/^[0-9]* (\(.*\)) \([A-Za-z]\) .*/\1 \2/p' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ "${s% *}" = "$name" ] && [ "${s##* }" != Z ]
}
pid_in() { [ -s "$1" ] && tr -dc 0-9 < "$1" || true; }
# stop_pidfile NAME PIDFILE: stop a daemon that we started (leftover cleanup)
stop_pidfile() {
  local name=$1 f=$2 pid i
  pid=$(pid_in "$f")
  if alive "$name" "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do alive "$name" "$pid" || break; sleep 0.1; done
    alive "$name" "$pid" && kill -KILL "$pid" 2>/dev/null || true
    say "stopped leftover $name (pid $pid)"
  fi
  rm -f "$f"
}
node_state() { sinfo -h -n "$NODE" -o '%T' 2>/dev/null | sort -u | paste -sd, -; }
wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local secs=$1 what=$2 i; shift 2
  for ((i = 0; i < secs * 10; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  die "timed out after ${secs}s waiting for $what"
}
show_log_and_die() { say "last lines of $1:"; tail -n 30 "$1" >&2 2>/dev/null || true; die "$2"; }

usage() {
  local parts=${PARTITIONS// /, }
  cat <<EOF

Slurm $(sinfo -V 2>/dev/null | awk '{print $2}') single-node test cluster is up.
  node:        $NODE (127.0.0.1), partitions: $parts (default: ${PARTITIONS%% *})
  config:      $CONF$( [ "$ACCOUNTING" = 1 ] && echo ", $DBDCONF" )
  logs/state:  $LOG, $STATE   (daemon pid files: $RUN)
  accounting:  $( [ "$ACCOUNTING" = 1 ] && echo "slurmdbd + MariaDB on 127.0.0.1:$DB_PORT: sacct works" || echo "off: sacct fails; use scontrol show job / squeue -t all (MinJobAge=${MIN_JOB_AGE}s)" )

  Slurm:  sinfo; sbatch --wrap 'sleep 5; echo hi'; sbatch -p gpu job.sh
          squeue; squeue -t all; scontrol show job ID; scancel ID
          sacct -X -P -j ID -o JobID,State,ExitCode
          sbatch --array=0-3 --wrap 'echo \$SLURM_ARRAY_TASK_ID'
  PBS:    qsub job.sh (a file starting with #!; not stdin); qstat; qstat -f ID; qdel ID
  stop:   $HERE/stop-local-slurm.sh
EOF
}

NODE=$(hostname -s)

# ------------------------------------------------ already running? -> done
if alive slurmctld "$(pid_in "$RUN/slurmctld.pid")" && alive slurmd "$(pid_in "$RUN/slurmd.pid")" \
   && { [ "$ACCOUNTING" != 1 ] || alive slurmdbd "$(pid_in "$RUN/slurmdbd.pid")"; } \
   && scontrol ping 2>/dev/null | grep -q 'is UP'; then
  st=$(node_state)
  have=$(sinfo -h -o '%R' 2>/dev/null | sort | paste -sd' ' -)
  want=$(printf '%s\n' $PARTITIONS | sort | paste -sd' ' -)
  if [ "$have" != "$want" ]; then
    say "daemons are up with partitions '$have', not '$want'; restarting"
  # (grep reads all of it: with -q it would exit at the match, scontrol would die of SIGPIPE,
  # and under pipefail a cluster that has preemption would be restarted every time)
  elif ! scontrol show config 2>/dev/null | grep -E '^PreemptType +=.*partition_prio' >/dev/null; then
    say "daemons are up without preemption by partition priority; restarting"
  else
    case $st in
      idle|mixed|allocated|completing|idle,*|mixed,*|allocated,*)
        say "already running (node $NODE is $st); nothing to do"
        usage; exit 0 ;;
    esac
    say "daemons are up but node state is '$st'; restarting"
  fi
fi

# ------------------------------------------------------------ 1. install
pkgs=(munge slurm-wlm slurmctld slurmd slurm-client slurm-wlm-basic-plugins slurm-wlm-torque)
[ "$ACCOUNTING" = 1 ] && pkgs+=(slurmdbd mariadb-server)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # No init system here: keep the packages' maintainer scripts from starting
  # daemons (munge, mariadb) themselves; we start our own below.
  added_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; added_policy=1
  fi
  trap '[ "$added_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d || true' EXIT
  t0=$(now_ms)
  apt-get -q -o DPkg::Lock::Timeout=600 update >"$HOME/.start-local-slurm-apt.log" 2>&1 \
    || apt-get -q -o DPkg::Lock::Timeout=600 update >>"$HOME/.start-local-slurm-apt.log" 2>&1 \
    || { tail -n 20 "$HOME/.start-local-slurm-apt.log"; die "apt-get update failed"; }
  apt-get -y -q -o DPkg::Lock::Timeout=600 install --no-install-recommends "${missing[@]}" \
    >>"$HOME/.start-local-slurm-apt.log" 2>&1 \
    || { tail -n 30 "$HOME/.start-local-slurm-apt.log"; die "apt-get install failed"; }
  if [ "$added_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; added_policy=0; fi
  say "packages installed in $(( $(now_ms) - t0 )) ms (log: $HOME/.start-local-slurm-apt.log)"
fi

# --------------------------------------- 2. clean up leftovers, make dirs
# munged, slurmd and qstat (hostname -f) look this host's name up
if ! getent hosts "$(hostname)" >/dev/null 2>&1; then
  names=$(hostname); [ "$NODE" != "$names" ] && names="$names $NODE"
  printf '127.0.0.1\t%s\n' "$names" >> /etc/hosts
  say "added '127.0.0.1 $names' to /etc/hosts (the host name did not resolve)"
fi
stop_pidfile slurmd    "$RUN/slurmd.pid"
stop_pidfile slurmctld "$RUN/slurmctld.pid"
stop_pidfile slurmdbd  "$RUN/slurmdbd.pid"
stop_pidfile mariadbd  "$RUN/mysql/mariadbd.pid"
stop_pidfile munged    "$RUN/munge/munged.pid"

if [ "$KEEP_STATE" != 1 ]; then
  rm -rf "$STATE" "$LOG"
fi
install -d -m 755 "$DIR" "$RUN" "$LOG" "$STATE" "$STATE/ctld" "$STATE/d"
install -d -m 755 -o munge -g munge "$RUN/munge" /run/munge
install -d -m 700 -o munge -g munge "$LOG/munge" /var/lib/munge /var/log/munge

# ---------------------------------------------------------- 3. configs
eval "$(slurmd -C | head -n 1 | tr ' ' '\n' \
  | grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore|RealMemory)=[0-9]+$' \
  | sed 's/^/HW_/')"
: "${HW_CPUs:?slurmd -C gave no CPU count}" "${HW_RealMemory:?slurmd -C gave no memory}"
MEM=${MEM_OVERRIDE:-$(( HW_RealMemory * 9 / 10 ))}
# Several one-CPU test jobs must run at once (the scheduler tests submit to
# both partitions concurrently); small CI machines get 8 advertised CPUs.
if [ -z "$CPUS_OVERRIDE" ] && [ "$HW_CPUs" -lt 8 ]; then CPUS_OVERRIDE=8; fi
if [ -n "$CPUS_OVERRIDE" ]; then
  CPUS=$CPUS_OVERRIDE
  NODE_HW="CPUs=$CPUS"
  OVERRIDES="SlurmdParameters=config_overrides"
else
  CPUS=$HW_CPUs
  # shellcheck disable=SC2154  # HW_* are set by the eval of `slurmd -C` above
  NODE_HW="CPUs=$HW_CPUs Boards=$HW_Boards SocketsPerBoard=$HW_SocketsPerBoard CoresPerSocket=$HW_CoresPerSocket ThreadsPerCore=$HW_ThreadsPerCore"
  OVERRIDES=""
fi
DEFMEM=$(( MEM / CPUS )); [ "$DEFMEM" -gt 1024 ] && DEFMEM=1024

if [ "$CGROUP" = 1 ]; then
  PROCTRACK=proctrack/cgroup; TASKPLUGIN=task/cgroup,task/affinity
  cat > /etc/slurm/cgroup.conf <<EOF
# written by start-local-slurm.sh
CgroupPlugin=autodetect
ConstrainCores=yes
ConstrainRAMSpace=yes
ConstrainDevices=no
EOF
  touch "$RUN/cgroup-mode"
else
  PROCTRACK=proctrack/linuxproc; TASKPLUGIN=task/none
  rm -f "$RUN/cgroup-mode"
  if grep -qs '^# written by start-local-slurm.sh' /etc/slurm/cgroup.conf; then rm -f /etc/slurm/cgroup.conf; fi
fi

if [ "$ACCOUNTING" = 1 ]; then
  ACCT="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30"
else
  ACCT="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi

PARTLINES=""; first=1
for p in $PARTITIONS; do
  if [ $first = 1 ]; then def=YES; first=0; else def=NO; fi
  PARTLINES+="PartitionName=$p Nodes=$NODE Default=$def MaxTime=INFINITE State=UP PreemptMode=OFF"$'\n'
done

mkdir -p /etc/slurm/plugstack.conf.d
cat > "$CONF" <<EOF
# written by $HERE/start-local-slurm.sh - single-node test cluster
ClusterName=localtest
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=$PROCTRACK
TaskPlugin=$TASKPLUGIN
ReturnToService=2
SlurmctldPort=6817
SlurmdPort=6818
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SchedulerType=sched/backfill
SchedulerParameters=$SCHED_PARAMS
# Preemption by partition priority, for the routing test's partitions of its own (a high tier
# outranking a low one whose PreemptMode is REQUEUE). Slurm refuses a cluster-wide
# PreemptMode=OFF with partition_prio ("PreemptType and PreemptMode values incompatible"), so
# the cluster-wide mode is REQUEUE and each partition here sets OFF: their jobs are never
# preempted, whatever another test's partition outranks them.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$DEFMEM
MinJobAge=$MIN_JOB_AGE
MailProg=/bin/true
JobSubmitPlugins=pbs
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG/jobcomp.txt
$ACCT
$OVERRIDES
NodeName=$NODE NodeAddr=127.0.0.1 $NODE_HW RealMemory=$MEM State=UNKNOWN
$PARTLINES
EOF

# PBS_* variables (PBS_JOBID, PBS_O_WORKDIR, PBS_ARRAY_INDEX, ...) in jobs
SPANK_PBS=$(dpkg -L slurm-wlm-basic-plugins | grep '/spank_pbs\.so$' | head -n 1)
if [ -n "$SPANK_PBS" ]; then
  echo "required $SPANK_PBS" > /etc/slurm/plugstack.conf.d/pbs.conf
fi

# munge key (the munge package normally generates one at install time)
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  mungekey --create --keyfile=/etc/munge/munge.key
fi
chown munge:munge /etc/munge /etc/munge/munge.key
chmod 700 /etc/munge; chmod 400 /etc/munge/munge.key

T0=$(now_ms)
# ----------------------------------------------------------- 4. munged
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "a munged is already serving /run/munge/munge.socket.2; using it (not ours, will not stop it)"
else
  runuser -u munge -- /usr/sbin/munged --pid-file="$RUN/munge/munged.pid" --log-file="$LOG/munge/munged.log" \
    || show_log_and_die "$LOG/munge/munged.log" "munged failed to start"
  wait_for 10 munged sh -c 'munge -n | unmunge'
fi

# ------------------------------------------------ 5. MariaDB + slurmdbd
if [ "$ACCOUNTING" = 1 ]; then
  if [ ! -d "$DBDIR/mysql" ]; then
    install -d -m 750 -o mysql -g mysql "$DBDIR"
    mariadb-install-db --no-defaults --user=mysql --datadir="$DBDIR" \
      --auth-root-authentication-method=socket --skip-test-db >"$LOG/mariadb-install.log" 2>&1 \
      || show_log_and_die "$LOG/mariadb-install.log" "mariadb-install-db failed"
  fi
  install -d -m 755 -o mysql -g mysql "$RUN/mysql" "$LOG/mysql"
  setsid /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$DBDIR" \
    --socket="$RUN/mysql/mysqld.sock" --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
    --pid-file="$RUN/mysql/mariadbd.pid" --log-error="$LOG/mysql/mariadb.log" \
    --innodb-buffer-pool-size=512M --innodb-lock-wait-timeout=900 --skip-log-bin \
    </dev/null >/dev/null 2>&1 &
  SQL=(mariadb --no-defaults -S "$RUN/mysql/mysqld.sock" -uroot)
  for ((i = 0; i < 300; i++)); do "${SQL[@]}" -e 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done
  "${SQL[@]}" -e 'select 1' >/dev/null 2>&1 || show_log_and_die "$LOG/mysql/mariadb.log" "mariadbd did not come up"
  [ "$KEEP_STATE" = 1 ] || "${SQL[@]}" -e 'DROP DATABASE IF EXISTS slurm_acct_db'
  "${SQL[@]}" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
    FLUSH PRIVILEGES;"
  cat > "$DBDCONF" <<EOF
# written by $HERE/start-local-slurm.sh
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
DebugLevel=info
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
  chown root:root "$DBDCONF"; chmod 600 "$DBDCONF"
  slurmdbd || show_log_and_die "$LOG/slurmdbd.log" "slurmdbd failed to start"
  for ((i = 0; i < 300; i++)); do sacctmgr -n -P list cluster >/dev/null 2>&1 && break; sleep 0.1; done
  sacctmgr -n -P list cluster >/dev/null 2>&1 || show_log_and_die "$LOG/slurmdbd.log" "slurmdbd is not answering"
fi
T1=$(now_ms)

# ------------------------------------------------- 6. slurmctld, slurmd
slurmctld || show_log_and_die "$LOG/slurmctld.log" "slurmctld failed to start"
slurmd || show_log_and_die "$LOG/slurmd.log" "slurmd failed to start"

st=""
for ((i = 0; i < 600; i++)); do
  st=$(node_state)
  case $st in
    idle) break ;;
    *drain*|down*)  # e.g. kept state from a node that was drained: resume it
      scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true ;;
  esac
  sleep 0.1
done
if [ "$st" != idle ]; then
  scontrol show node "$NODE" >&2 || true
  tail -n 20 "$LOG/slurmctld.log" "$LOG/slurmd.log" >&2 || true
  die "node $NODE did not become idle within 60 s (state: '${st:-none}')"
fi
TI=$(now_ms)
# slurmctld runs its first main scheduling cycle ~3 s after it starts; jobs
# submitted before that stay PENDING until then.  Wait for it (sdiag counts the
# cycles) so that a job submitted right after this script starts at once.
for ((i = 0; i < 150; i++)); do
  c=$(sdiag 2>/dev/null | awk '/Main schedule statistics/ {m = 1} m && /Total cycles:/ {print $3; exit}')
  [ "${c:-0}" -ge 1 ] 2>/dev/null && break
  sleep 0.1
done
T2=$(now_ms)
say "node $NODE idle after $(( TI - T0 )) ms, scheduler ready after $(( T2 - T0 )) ms (munge+db: $(( T1 - T0 )) ms)"
usage
