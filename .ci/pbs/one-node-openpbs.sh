#!/bin/bash
# A real one-node OpenPBS 23.06.06 (the open-source PBS Professional: server, scheduler, comm,
# MOM and its PostgreSQL datastore), built from the source tarball beside this script and run
# inside a network namespace of its own, for embedfleet's PBS tests. Debian 12, as root.
# Adapted from the team's shared/openpbs/one-node-openpbs.sh; the project owns this copy.
#
#   bash one-node-openpbs.sh ci         what .ci/run does (start-local-pbs.sh): /opt/pbs from
#                                       the cache tarball, else built and cached; then
#                                       configure, start, smoke
#   bash one-node-openpbs.sh all        deps, build, install, configure, start, smoke
#   bash one-node-openpbs.sh start|stop|smoke|env|site
#
# Why a namespace: PBS refuses a host name that resolves only to 127.0.0.0/8. The server's name
# gets an address on the namespace's own loopback device, so nothing leaves the namespace and no
# address of the machine is touched. Every PBS command runs inside it: `ip netns exec $NS qsub
# ...` (`env` prints the wrapper). PBS's commands are under /opt/pbs/bin: /usr/bin/qsub may be
# Slurm's Torque wrapper (slurm-wlm-torque).
#
# PBS's datastore is a PostgreSQL of its own (Debian's postgresql-15 binaries, data in
# /var/spool/pbs/datastore, port 15007). It listens inside the namespace, so its port cannot
# clash with another PostgreSQL cluster of the machine, and it is started and stopped by its
# data directory (`pg_ctl -D`), never by name. One caveat, PBS's own: when the datastore's very
# first creation fails to stop it, pbs_db_utility SIGTERMs every postgres of the same binaries
# whose parent is init. That path is taken only by a broken first install.
#
# Settings (environment variables):
#   NS=embedfleet-pbs            the network namespace
#   PBS_HOSTNAME=pbshost         the server's name, on PBS_IP
#   PBS_IP=10.233.0.10           only on the namespace's loopback device
#   NODE_NCPUS=16                the node's advertised CPUs (more than the machine's 2: the
#                                tests' jobs are one-CPU sleepers, and five run at once)
#   PBS_CACHE=/var/tmp/embedfleet-opt-pbs-<hash>.tar.gz
#                                the installed /opt/pbs, outside the clone: a warm machine
#                                restores it (seconds) instead of building (minutes); the hash
#                                is of the tarball and patches, so a new source builds again
#   PBS_LOG=/var/tmp/embedfleet-pbs.log
#                                what apt, the build, the install and `/etc/init.d/pbs start`
#                                printed (ci, all and start begin it anew); its last lines are
#                                shown when one of them fails
#
# Runs from / whatever the caller's working directory (one that is deleted, or that the
# `postgres` user cannot read, breaks the datastore's creation and start).
set -euo pipefail
# shellcheck source=../lib/err.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/err.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
cd /
VERSION=23.06.06
SRC_DIR=${SRC_DIR:-/var/tmp/openpbs-src}
PREFIX=/opt/pbs
NS=${NS:-embedfleet-pbs}
PBS_HOSTNAME=${PBS_HOSTNAME:-pbshost}
PBS_IP=${PBS_IP:-10.233.0.10}
PBS_USER=${PBS_USER:-pbsuser}           # the smoke job's user; the tests submit as root
NODE_NCPUS=${NODE_NCPUS:-16}
SOURCE_HASH=$(cat "$HERE/openpbs-$VERSION.tar.gz" "$HERE"/000*.patch | sha256sum | cut -c1-12)
PBS_CACHE=${PBS_CACHE:-/var/tmp/embedfleet-opt-pbs-$SOURCE_HASH.tar.gz}
STAMP=$PREFIX/.embedfleet-source
LOG=${PBS_LOG:-/var/tmp/embedfleet-pbs.log}
export DEBIAN_FRONTEND=noninteractive
in_ns() { ip netns exec "$NS" "$@"; }
qmgr() { in_ns $PREFIX/bin/qmgr -c "$1"; }

BUILD_DEPS="gcc g++ make autoconf automake libtool pkg-config m4 libhwloc-dev libx11-dev libxt-dev
 libedit-dev libical-dev libncurses-dev perl postgresql-server-dev-all postgresql postgresql-contrib
 libpq-dev python3-dev tcl-dev tk-dev swig libexpat1-dev expat libssl-dev libxext-dev libxft-dev
 zlib1g-dev sudo file bc iproute2"
RUNTIME_DEPS="postgresql postgresql-contrib libpq-dev libical3 libhwloc15 libpython3.11 libtcl8.6
 libtk8.6 libedit2 libexpat1 libxft2 libxss1 libssl3 zlib1g sudo iproute2"

# logged WHAT COMMAND...: COMMAND's output goes to $LOG; when it fails, WHAT and the log's last
# lines go to stderr (and the caller's line to the ERR trap's message).
logged() {
  local what=$1 rc=0; shift
  echo "== $(date -u +%FT%TZ) $what: $*" >>"$LOG"
  "$@" >>"$LOG" 2>&1 </dev/null || rc=$?
  [ "$rc" = 0 ] && return 0
  echo "openpbs: $what failed (exit $rc): $*; the last lines of $LOG:" >&2
  tail -n 40 "$LOG" >&2
  return "$rc"
}

deps() {
  local pkgs=$1 apt=(apt-get -q -o DPkg::Lock::Timeout=600)
  # shellcheck disable=SC2086
  "${apt[@]}" install -y --no-upgrade $pkgs >>"$LOG" 2>&1 </dev/null \
    || { logged "apt-get update" "${apt[@]}" update && logged "apt-get install" "${apt[@]}" install -y --no-upgrade $pkgs; }
}

# In a subshell: its `cd` ends with it (ensure_installed removes $SRC_DIR afterwards, and the
# rest of this script must not run in a deleted directory).
build() (
  rm -rf "$SRC_DIR" && mkdir -p "$SRC_DIR"
  tar -C "$SRC_DIR" --strip-components=1 -xzf "$HERE/openpbs-$VERSION.tar.gz"
  cd "$SRC_DIR"
  # 23.06.06 does not compile against Python 3.11 (eval.h is gone); upstream's fixes from master
  # (#2594, and #2573: PY_SSIZE_T_CLEAN, without which a hook's pbs.logmsg fails at run time).
  for p in "$HERE"/0001-*.patch "$HERE"/0002-*.patch; do patch -p1 -s < "$p"; done
  logged autogen nice -n 10 ./autogen.sh
  # --with-python=/usr: a pyenv python on PATH would be baked into pbs_server's rpath
  logged configure nice -n 10 ./configure --prefix=$PREFIX --with-python=/usr
  logged make nice -n 10 make -j"$(nproc)"
)

install_pbs() {
  logged "make install" make -C "$SRC_DIR" install
  chmod 4755 $PREFIX/sbin/pbs_iff $PREFIX/sbin/pbs_rcp     # client authentication is setuid
  echo "$SOURCE_HASH" > "$STAMP"
}

# /opt/pbs as this source builds it: kept if its stamp matches, else restored from the cache
# tarball, else built, installed and cached.
ensure_installed() {
  if [ "$(cat "$STAMP" 2>/dev/null)" = "$SOURCE_HASH" ] && [ -x $PREFIX/sbin/pbs_server.bin ]; then
    deps "$RUNTIME_DEPS"; return
  fi
  stop
  rm -rf $PREFIX
  if [ -f "$PBS_CACHE" ]; then
    deps "$RUNTIME_DEPS"
    tar -C / -xzpf "$PBS_CACHE"
    echo "openpbs: /opt/pbs restored from $PBS_CACHE"
  else
    deps "$BUILD_DEPS"
    build
    install_pbs
    tar -C / -czf "$PBS_CACHE.partial" "${PREFIX#/}" && mv "$PBS_CACHE.partial" "$PBS_CACHE"
    rm -rf "$SRC_DIR"
    echo "openpbs: built from source; cached as $PBS_CACHE"
  fi
}

namespace() {
  ip netns list | grep -qw "$NS" || ip netns add "$NS"
  in_ns ip link set lo up
  in_ns ip -4 addr show dev lo | grep -q " $PBS_IP/" || in_ns ip addr add "$PBS_IP/32" dev lo
  # `ip netns exec` shows /etc/netns/$NS/hosts as /etc/hosts inside the namespace
  mkdir -p /etc/netns/"$NS"
  { grep -v " $PBS_HOSTNAME\$" /etc/hosts; echo "$PBS_IP $PBS_HOSTNAME"; } > /etc/netns/"$NS"/hosts
}

configure_pbs() {
  id postgres >/dev/null 2>&1 || useradd -r -m -d /var/lib/postgresql -s /bin/bash postgres
  id "$PBS_USER" >/dev/null 2>&1 || useradd -m -s /bin/bash "$PBS_USER"
  [ -d /var/spool/pbs/server_priv ] || $PREFIX/libexec/pbs_postinstall >>"$LOG" 2>&1 </dev/null \
    || echo "openpbs: note: pbs_postinstall exited $? (its output is in $LOG)" >&2
  cat > /etc/pbs.conf <<EOF
PBS_SERVER=$PBS_HOSTNAME
PBS_START_SERVER=1
PBS_START_SCHED=1
PBS_START_COMM=1
PBS_START_MOM=1
PBS_EXEC=$PREFIX
PBS_HOME=/var/spool/pbs
PBS_CORE_LIMIT=unlimited
PBS_SCP=/usr/bin/scp
PBS_LEAF_NAME=$PBS_HOSTNAME
PBS_MOM_NODE_NAME=$PBS_HOSTNAME
EOF
  # job .o/.e files are copied back with cp (no sshd for scp)
  local mom=/var/spool/pbs/mom_priv/config changed=
  grep -q '^\$usecp' $mom || { echo '$usecp *:/ /' >> $mom; changed=1; }
  # The MOM looks at its jobs' walltime every 10 to 120 s by default: a walltime test would
  # wait minutes for its kill. Every 1 to 3 s here.
  grep -q '^\$max_check_poll' $mom || { printf '$min_check_poll 1\n$max_check_poll 3\n' >> $mom; changed=1; }
  local pid; pid=$(cat /var/spool/pbs/mom_priv/mom.lock 2>/dev/null || true)
  [ -z "$changed" ] || [ -z "$pid" ] || kill -HUP "$pid" 2>/dev/null || true
}

# The scheduler schedules on the custom resources Polaris asks for (`site`). Its config is
# written by the first start (not by the install): edited once the daemons run.
sched_resources() {
  local conf=/var/spool/pbs/sched_priv/sched_config pid
  [ -f "$conf" ] || { echo "openpbs: no $conf after the start" >&2; return 1; }
  grep -q '^resources: .*ngpus' "$conf" && return 0
  sed -i 's/^resources: "\(.*\)"/resources: "\1, ngpus, system"/' "$conf"
  # the scheduler reads its config again on SIGHUP
  pid=$(cat /var/spool/pbs/sched_priv/sched.lock 2>/dev/null || true)
  [ -z "$pid" ] || kill -HUP "$pid" 2>/dev/null || true
}

# What PBS wrote about a start that failed: the newest of each daemon's logs and of the
# datastore's, and the processes in the namespace.
pbs_logs() {
  local d f
  # (the datastore's log directory is PostgreSQL's default, log/; pg_log/ before PostgreSQL 10)
  for d in server_logs datastore/log datastore/pg_log comm_logs mom_logs sched_logs; do
    f=$(ls -t /var/spool/pbs/$d/* 2>/dev/null | head -n 1 || true)
    [ -n "$f" ] || continue
    echo "--- the last lines of $f:" >&2
    tail -n 12 "$f" >&2 || true
  done
  echo "--- processes in the namespace $NS: $(ip netns pids "$NS" 2>/dev/null | xargs -r ps -o comm= -p | sort | uniq -c | xargs || true)" >&2
}

start() {
  namespace
  # first start: initdb of the datastore (port 15007, inside the namespace)
  if ! in_ns $PREFIX/bin/qstat -B >/dev/null 2>&1; then
    local rc=0 from
    echo "== $(date -u +%FT%TZ) /etc/init.d/pbs start" >>"$LOG"
    from=$(wc -l <"$LOG")
    in_ns /etc/init.d/pbs start >>"$LOG" 2>&1 </dev/null || rc=$?
    if [ "$rc" != 0 ]; then
      echo "openpbs: \`/etc/init.d/pbs start\` failed (exit $rc); it printed (in $LOG):" >&2
      tail -n +"$((from + 1))" "$LOG" | tail -n 30 >&2
      pbs_logs
      return 1
    fi
  fi
  # (minutes on a loaded machine: the first start creates the datastore)
  for _ in $(seq 1 600); do in_ns $PREFIX/bin/qstat -B >/dev/null 2>&1 && break; sleep 0.5; done
  in_ns $PREFIX/bin/qstat -B >/dev/null || { echo "openpbs: the server did not answer in 5 min" >&2; pbs_logs; return 1; }
  sched_resources
  in_ns $PREFIX/bin/pbsnodes "$PBS_HOSTNAME" >/dev/null 2>&1 || qmgr "create node $PBS_HOSTNAME"
  qmgr "set node $PBS_HOSTNAME resources_available.ncpus = $NODE_NCPUS"
  # `rehearsal` is disabled for a while by the reduced rehearsal (tests/e2e/rehearsal.rs), and
  # no other test submits to it
  for queue in debug preemptable rehearsal; do
    qmgr "list queue $queue" >/dev/null 2>&1 || qmgr "create queue $queue queue_type=execution"
    qmgr "set queue $queue enabled = True"; qmgr "set queue $queue started = True"
  done
  qmgr "set server default_queue = debug"
  qmgr "set server job_history_enable = True"    # qstat -x needs it
  qmgr "set server acl_roots = root"             # the tests submit as root (docs/testing.md)
  # without events the scheduler runs every 600 s; a job sent before the MOM reported in waits
  qmgr "set server scheduler_iteration = 10"
  site
  for _ in $(seq 1 600); do in_ns $PREFIX/bin/pbsnodes "$PBS_HOSTNAME" 2>/dev/null | grep -q '^ *state = free' && break; sleep 0.5; done
  in_ns $PREFIX/bin/pbsnodes "$PBS_HOSTNAME" 2>/dev/null | grep -q '^ *state = free' \
    || echo "openpbs: note: the node $PBS_HOSTNAME is not free after 5 min: $(in_ns $PREFIX/bin/pbsnodes "$PBS_HOSTNAME" 2>&1 | grep '^ *state =' | xargs || true)" >&2
  qmgr "set server scheduling = True"
  # A clean slate: no job left queued or running by an earlier run takes the node's CPUs.
  local left
  left=$(in_ns $PREFIX/bin/qselect 2>/dev/null || true)
  # shellcheck disable=SC2086
  [ -z "$left" ] || in_ns $PREFIX/bin/qdel -W force $left >/dev/null 2>&1 || true
}

# What Polaris has that a bare server lacks, so that its job directives are checked by PBS:
# the custom resources `ngpus` (per node, consumable), `system` (per node) and `filesystems`
# (per job); and an express queue `urgent` whose jobs preempt the `preemptable` queue's by
# requeueing them (preempt_order R), as Polaris's demand queues do.
site() {
  local r
  for r in "ngpus type=long, flag=nh" "system type=string, flag=h" "filesystems type=string"; do
    qmgr "list resource ${r%% *}" >/dev/null 2>&1 || qmgr "create resource $r"
  done
  qmgr "set node $PBS_HOSTNAME resources_available.ngpus = 4"
  qmgr "set node $PBS_HOSTNAME resources_available.system = polaris"
  qmgr "list queue urgent" >/dev/null 2>&1 || qmgr "create queue urgent queue_type=execution"
  qmgr "set queue urgent priority = 200"          # >= the scheduler's preempt_queue_prio (150)
  qmgr "set queue urgent resources_default.preempt_targets = \"queue=preemptable\""
  qmgr "set queue urgent enabled = True"; qmgr "set queue urgent started = True"
  qmgr "set sched default preempt_order = R"
}

stop() {
  ip netns list 2>/dev/null | grep -qw "$NS" || return 0
  in_ns /etc/init.d/pbs stop >/dev/null 2>&1 || true
  # What is left in the namespace is PBS's: qsub's per-user daemons. Ended by their ids.
  local pid
  for pid in $(ip netns pids "$NS" 2>/dev/null); do kill "$pid" 2>/dev/null || true; done
}

smoke() {
  local id st
  id=$(in_ns su - "$PBS_USER" -c "echo 'sleep 1' | $PREFIX/bin/qsub -q debug -l select=1:ncpus=1 -l walltime=00:01:00")
  for _ in $(seq 1 180); do
    st=$(in_ns $PREFIX/bin/qstat -x -f -F json "$id" | python3 -c 'import json,sys; j=next(iter(json.load(sys.stdin)["Jobs"].values())); print(j["job_state"], j.get("Exit_status",""))')
    [ "${st%% *}" = F ] && break; sleep 1
  done
  echo "openpbs: smoke job $id: job_state and Exit_status $st"; [ "$st" = "F 0" ]
}

case "${1:-ci}" in
  ci) : >"$LOG"; ensure_installed; configure_pbs; start; smoke ;;
  all) : >"$LOG"; deps "$BUILD_DEPS"; build; install_pbs; configure_pbs; start; smoke ;;
  deps) deps "$BUILD_DEPS" ;; build) build ;; install) install_pbs ;; configure) configure_pbs ;;
  start) : >"$LOG"; configure_pbs; start ;; stop) stop ;; smoke) smoke ;; site) site ;;
  env) echo "ip netns exec $NS" ;;
  *) echo "usage: $0 [ci|all|deps|build|install|configure|start|stop|smoke|site|env]" >&2; exit 2 ;;
esac
