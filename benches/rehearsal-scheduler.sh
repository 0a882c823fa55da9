# The scheduler's side of benches/rehearsal.sh (sourced by it), for SCHEDULER=slurm (the one-node
# Slurm of .ci/slurm/start-local-slurm.sh) or SCHEDULER=pbs (the one-node OpenPBS of
# .ci/pbs/start-local-pbs.sh, every command inside its network namespace PBS_NS). The same
# faults on either: jobs cancelled while running (`scancel` / `qdel`), a queue drained (Slurm
# State=DRAIN / PBS enabled = False: no new job taken, the running ones go on) and released,
# the run's pending jobs held and released, the hung job's end read from the scheduler.
#
#   sched_up                  the scheduler answers
#   jobs_of DIR [running|pending]   ids of the jobs whose script or log is under DIR/
#   cancel_job ID             cancel one job
#   hold_jobs ID... / release_jobs ID...
#   drain_queue Q / undrain_queue Q
#   job_id_var                the job environment's variable holding its id
#   timed_out_state ID        TIMEOUT once the scheduler says the job died at its walltime
#   release_hung PID          what is left of the hung job's embed-job after its walltime kill
#   config_table              the run config's [scheduler] part
#   CANCEL_KIND               the fault's name in the report (scancel / qdel)

SCHEDULER=${SCHEDULER:-slurm}
PBS_NS=${PBS_NS:-embedfleet-pbs}

if [ "$SCHEDULER" = pbs ]; then
  CANCEL_KIND=qdel
  pbs() { ip netns exec "$PBS_NS" /opt/pbs/bin/"$@"; }
  sched_up() { pbs qstat -B >/dev/null 2>&1 || { echo "no PBS: run .ci/pbs/start-local-pbs.sh" >&2; return 1; }; }
  jobs_of() {
    pbs qstat -f -F json 2>/dev/null | python3 -c '
import json, sys
d, want = sys.argv[1] + "/", {"running": "R", "pending": "Q"}.get(sys.argv[2] if len(sys.argv) > 2 else "")
try:
    jobs = json.load(sys.stdin).get("Jobs", {})
except ValueError:
    jobs = {}
for i, j in jobs.items():
    if d in j.get("Submit_arguments", "") and (want is None or j.get("job_state") == want):
        print(i)' "$@"
  }
  cancel_job() { pbs qdel "$1" >/dev/null 2>&1; }
  hold_jobs() { [ $# = 0 ] || pbs qhold "$@" >/dev/null 2>&1; }
  release_jobs() { [ $# = 0 ] || pbs qrls "$@" >/dev/null 2>&1; }
  drain_queue() { pbs qmgr -c "set queue $1 enabled = False"; }
  undrain_queue() { pbs qmgr -c "set queue $1 enabled = True"; }
  job_id_var() { echo PBS_JOBID; }
  timed_out_state() { # PBS's JOB_EXEC_KILL_WALLTIME
    local s
    s=$(pbs qstat -x -f -F json "$1" 2>/dev/null | python3 -c 'import json,sys; j=next(iter(json.load(sys.stdin).get("Jobs",{}).values()),{}); print(j.get("job_state",""), j.get("Exit_status",""))')
    case "$s" in "F -29") echo TIMEOUT ;; F*) echo "${s// /_}" ;; *) echo "" ;; esac
  }
  # PBS's MOM (without its cgroup hook) ends a job at its walltime by signalling the job's
  # session: the embed-job the fault stopped keeps the SIGTERM pending and outlives its job,
  # stopped (Slurm's cgroup ends it with SIGKILL). Continued, it takes the signal and ends.
  release_hung() {
    kill -CONT "$1" 2>/dev/null || return 0
    for _ in $(seq 1 20); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.5; done
  }
  config_table() {
    local t w='"netns", "exec", "'"$PBS_NS"'"'
    echo '[scheduler]'; echo 'backend = "pbs"'; echo '[scheduler.pbs]'
    for t in qsub qstat qdel; do echo "$t = { path = \"ip\", extra_args = [$w, \"/opt/pbs/bin/$t\"] }"; done
  }
else
  CANCEL_KIND=scancel
  sched_up() { sinfo -h >/dev/null 2>&1 || { echo "no Slurm: run .ci/slurm/start-local-slurm.sh" >&2; return 1; }; }
  jobs_of() { # squeue's default states without a filter: the open jobs
    local states=()
    case "${2:-}" in running) states=(-t R) ;; pending) states=(-t PD) ;; esac
    squeue -h "${states[@]}" -o '%i %o' 2>/dev/null | awk -v w="$1/" 'index($2, w) == 1 {print $1}'
  }
  cancel_job() { scancel "$1" 2>/dev/null; }
  hold_jobs() { [ $# = 0 ] || scontrol hold "$(IFS=,; echo "$*")" >/dev/null 2>&1; }
  release_jobs() { [ $# = 0 ] || scontrol release "$(IFS=,; echo "$*")" >/dev/null 2>&1; }
  drain_queue() { scontrol update PartitionName="$1" State=DRAIN; }
  undrain_queue() { scontrol update PartitionName="$1" State=UP; }
  job_id_var() { echo SLURM_JOB_ID; }
  timed_out_state() { sacct -n -X -j "$1" -o State 2>/dev/null | tr -d ' ' | grep -v '^RUNNING$' || true; }
  release_hung() { :; }
  config_table() { echo '[scheduler]'; echo 'backend = "slurm"'; }
fi
