#!/usr/bin/env bash
# A cold `.ci/run` on this machine, as on one that never ran it (issue 60, items 13 and 14):
# the servers stopped, and every cache and build moved aside under /var/tmp/warm (to restore by
# hand, or delete: the run makes them again) — /opt/pbs and /var/spool/pbs, OpenPBS's cache
# tarball and source, the PostgreSQL cluster and pgvector's installed extension, the torch
# venv, the build cache — then a fresh clone of this checkout in /var/tmp/cold-clone.
#   Phase 1: each server script alone from nothing, run from a deleted directory, stdin from
#            /dev/null (the way the OpenPBS start once died silently).
#   Phase 2: the caches moved aside again, then the whole .ci/run.
# Each phase's exit status and wall time go to $LOGS/cold.result, the logs beside it.
#   sudo bash benches/cold-ci.sh        (as root, as .ci/run; apt packages stay installed)
set -u
REPO=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
LOGS=${LOGS:-/var/tmp/cold-logs}; mkdir -p "$LOGS"
W=/var/tmp/warm
[ -e "$W" ] && { echo "cold-ci.sh: $W holds an earlier run's caches: restore or delete them first" >&2; exit 1; }
mkdir -p "$W"
aside() { # phase
  cd "$REPO"
  bash .ci/slurm/stop-local-slurm.sh >/dev/null 2>&1
  bash .ci/pbs/stop-local-pbs.sh >/dev/null 2>&1
  bash .ci/pgvector/stop-local-pg.sh >/dev/null 2>&1
  sleep 2
  mkdir -p "$W/$1"
  for p in /var/tmp/embedfleet-target /var/tmp/embedfleet-torch /var/tmp/embedfleet-models /var/tmp/embedfleet-pg /opt/pbs /var/spool/pbs /var/tmp/openpbs-src /var/tmp/embedfleet-opt-pbs-*.tar.gz /var/tmp/embedfleet-pbs.log /var/tmp/embedfleet-pg-apt.log /var/tmp/pbs_boot_check; do
    [ -e "$p" ] && mv "$p" "$W/$1/$(echo "$p" | tr / _)"
  done
  ctl=/usr/share/postgresql/15/extension/vector.control
  [ -e $ctl ] && mv $ctl "$W/$1/vector.control"
}
aside warm
rm -rf /var/tmp/cold-clone && git clone -q "$REPO" /var/tmp/cold-clone
R=$LOGS/cold.result; : > $R
for s in slurm/start-local-slurm.sh pbs/start-local-pbs.sh pgvector/start-local-pg.sh; do
  d=$(mktemp -d); cd "$d"; rmdir "$d"
  t0=$(date +%s)
  bash /var/tmp/cold-clone/.ci/$s </dev/null > $LOGS/cold-$(dirname $s).log 2>&1
  echo "phase1 $s rc=$? wall_s=$(( $(date +%s) - t0 ))" >> $R
done
cd /
aside phase1
cd /var/tmp/cold-clone
start=$(date +%s)
bash .ci/run </dev/null > $LOGS/cold.log 2>&1
rc=$?
echo "phase2 .ci/run rc=$rc wall_s=$(( $(date +%s) - start ))" >> $R
