//! Parsers of scheduler output (on captured samples), state mapping, job script templates and
//! the TOML config. No scheduler needed.

use std::collections::BTreeMap;
use std::path::PathBuf;

use embedfleet_orchestrator::scheduler::{
    parse_qstat_json, parse_qstat_text, parse_sacct, parse_scontrol, parse_squeue, pbs_state,
    render_job_script, slurm_state, template, Backend, JobState, PbsFlavor, SacctMode,
    SchedulerConfig, ScriptConfig, ScriptJob, TemplateError,
};

fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/scheduler")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn failed(code: Option<i32>, reason: &str) -> JobState {
    JobState::Failed {
        exit_code: code,
        reason: reason.to_string(),
    }
}

// ---------------------------------------------------------------- Slurm

#[test]
fn squeue_captured_from_slurm_22_05() {
    let rows = parse_squeue(&fixture("squeue.txt")).unwrap();
    let got: Vec<(&str, JobState, &str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r.id.as_str(),
                r.job_state(),
                r.partition.as_str(),
                r.name.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("15", JobState::Cancelled, "debug", "embed-b000010"),
            ("13", JobState::Running, "debug", "embed-b000008"),
            (
                "14",
                failed(None, "FAILED: NonZeroExitCode"),
                "gpu",
                "embed-b000009"
            ),
            ("12", JobState::Pending, "gpu", "embed-b000007"),
        ]
    );
}

#[test]
fn squeue_rejects_other_formats() {
    assert!(parse_squeue("JOBID PARTITION NAME\n12 debug x\n").is_err());
    assert_eq!(parse_squeue("\n").unwrap(), vec![]);
}

#[test]
fn sacct_captured_from_slurm_22_05() {
    let rows = parse_sacct(&fixture("sacct.txt")).unwrap();
    let got: Vec<(&str, JobState)> = rows
        .iter()
        .map(|r| (r.id.as_str(), r.job_state()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("1", JobState::Completed),
            ("12", JobState::Pending),
            ("13", JobState::Running),
            ("14", failed(Some(3), "exit code 3")),
            ("15", JobState::Cancelled),
        ]
    );
}

#[test]
fn sacct_other_final_states() {
    // Lines in sacct's -P format for states the test cluster cannot produce on demand.
    let text = "20|TIMEOUT|0:15|None\n21|OUT_OF_MEMORY|0:125|None\n22|NODE_FAIL|0:0|None\n\
                23|PREEMPTED|0:15|None\n24|FAILED|0:9|None\n25|BOOT_FAIL|0:0|None\n26|DEADLINE|0:0|None\n";
    let states: Vec<JobState> = parse_sacct(text)
        .unwrap()
        .iter()
        .map(|r| r.job_state())
        .collect();
    assert_eq!(
        states,
        vec![
            JobState::Timeout,
            JobState::OutOfMemory,
            JobState::NodeFail,
            JobState::Preempted,
            failed(None, "killed by signal 9"),
            JobState::NodeFail,
            JobState::Timeout,
        ]
    );
}

#[test]
fn scontrol_captured_from_slurm_22_05() {
    let rows = parse_scontrol(&fixture("scontrol.txt")).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].id, "14");
    assert_eq!(rows[0].name, "embed-b000009");
    assert_eq!(rows[0].partition, "gpu");
    assert_eq!(rows[0].exit, Some((3, 0)));
    assert_eq!(rows[0].job_state(), failed(Some(3), "exit code 3"));
    assert_eq!(rows[1].id, "13");
    assert_eq!(rows[1].job_state(), JobState::Running);
}

#[test]
fn scontrol_values_with_spaces_stay_whole() {
    let rows = parse_scontrol("JobId=7 JobName=a b c JobState=COMPLETED ExitCode=0:0\n").unwrap();
    assert_eq!(rows[0].name, "a b c");
    assert_eq!(rows[0].job_state(), JobState::Completed);
    assert!(parse_scontrol("no pairs here\n").is_err());
}

#[test]
fn slurm_state_names() {
    assert_eq!(
        slurm_state("CANCELLED by 1000", None, ""),
        JobState::Cancelled
    );
    assert_eq!(slurm_state("COMPLETING", None, ""), JobState::Running);
    assert_eq!(slurm_state("REQUEUED", None, ""), JobState::Pending);
    assert_eq!(slurm_state("SUSPENDED", None, ""), JobState::Running);
    assert!(matches!(
        slurm_state("WEIRD", None, ""),
        JobState::Failed { .. }
    ));
}

// ---------------------------------------------------------------- PBS

#[test]
fn pbspro_json_as_on_polaris() {
    let jobs = parse_qstat_json(&fixture("pbspro_qstat_xf.json")).unwrap();
    assert_eq!(jobs.len(), 10);
    let by_id = |n: u32| {
        let id = format!("{n}.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov");
        jobs.iter()
            .find(|j| j.id == id)
            .unwrap_or_else(|| panic!("no job {id}"))
    };
    let state = |n: u32| pbs_state(by_id(n), false, None);
    assert_eq!(
        by_id(2871001).get("Resource_List.select"),
        Some("1:system=polaris")
    );
    assert_eq!(by_id(2871001).get("Job_Name"), Some("embed-b000001"));
    assert_eq!(by_id(2871001).get("queue"), Some("small"));
    assert_eq!(state(2871001), JobState::Running);
    assert_eq!(state(2871002), JobState::Pending);
    assert_eq!(state(2871003), JobState::Completed);
    assert_eq!(state(2871004), JobState::Timeout);
    assert_eq!(state(2871005), failed(Some(2), "exit code 2"));
    assert_eq!(state(2871006), JobState::Cancelled);
    assert_eq!(state(2871007), JobState::NodeFail);
    assert_eq!(state(2871008), failed(None, "killed by signal 9"));
    assert_eq!(state(2871009), JobState::Pending);
    assert_eq!(state(2871010), JobState::Timeout);
    // A job this process deleted is Cancelled whatever signal ended it.
    assert_eq!(pbs_state(by_id(2871008), true, None), JobState::Cancelled);
}

#[test]
fn pbspro_json_without_jobs_and_invalid_json() {
    assert_eq!(
        parse_qstat_json(r#"{"timestamp":1,"pbs_version":"2022.1.3"}"#).unwrap(),
        vec![]
    );
    assert!(parse_qstat_json("{\"Jobs\":{\"1.s\":{\"comment\":\"bad \\q\"}}}").is_err());
}

#[test]
fn pbspro_text_with_continuation_lines() {
    let jobs = parse_qstat_text(&fixture("pbspro_qstat_xf.txt")).unwrap();
    let ids: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(
        ids,
        vec![
            "2871003.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov",
            "2871004.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov",
            "2871002.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov"
        ]
    );
    assert_eq!(
        jobs[0].get("comment"),
        Some("Job run at Sun Nov 29 at 22:10 on (x3102c0s7b0n0:ncpus=64:ngpus=4) and finished")
    );
    assert_eq!(
        jobs[0].get("Error_Path"),
        Some("polaris-login-02.hsn.cm.polaris.alcf.anl.gov:/lus/eagle/projects/EmbedProj/run/logs/embed-b000003.err")
    );
    // A continuation line that itself contains " = " stays part of Variable_List.
    let vars = jobs[0].get("Variable_List").unwrap();
    assert!(
        vars.ends_with("PBS_O_QUEUE = prod,PBS_O_WORKDIR=/lus/eagle/projects/EmbedProj/run"),
        "{vars}"
    );
    assert_eq!(jobs[0].get("run_count"), Some("1"));
    assert_eq!(jobs[0].exit_status(), Some(0));
    let states: Vec<JobState> = jobs.iter().map(|j| pbs_state(j, false, None)).collect();
    assert_eq!(
        states,
        vec![JobState::Completed, JobState::Timeout, JobState::Pending]
    );
}

#[test]
fn torque_text_from_slurm_wlm_torque() {
    let jobs = parse_qstat_text(&fixture("torque_qstat_f.txt")).unwrap();
    let ids: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids, vec!["16", "17", "9"]);
    assert_eq!(jobs[0].get("Job_Name"), Some("pbs-run"));
    assert_eq!(jobs[0].get("queue"), Some("gpu"));
    assert_eq!(pbs_state(&jobs[0], false, None), JobState::Running);
    assert_eq!(pbs_state(&jobs[1], false, None), JobState::Pending);
    // `C` without an exit status: the marker decides; without one it is a failure, never a
    // silent success.
    assert_eq!(
        pbs_state(&jobs[2], false, Some(JobState::Completed)),
        JobState::Completed
    );
    assert_eq!(pbs_state(&jobs[2], true, None), JobState::Cancelled);
    assert!(matches!(
        pbs_state(&jobs[2], false, None),
        JobState::Failed {
            exit_code: None,
            ..
        }
    ));
}

#[test]
fn qstat_text_rejects_garbage() {
    assert!(parse_qstat_text("    job_state = R\n").is_err());
    assert_eq!(parse_qstat_text("").unwrap(), vec![]);
}

// ---------------------------------------------------------------- templates

fn job(batches: Vec<u64>) -> ScriptJob {
    ScriptJob {
        job_name: "embed-b000042".into(),
        queue: "debug".into(),
        run_dir: "/runs/my run".into(),
        batches,
        output: "/runs/my run/logs/b42.log".into(),
        error: None,
        marker: Some("/runs/my run/done/b42".into()),
        embed_args: Vec::new(),
    }
}

#[test]
fn slurm_builtin_template() {
    let cfg = ScriptConfig {
        account: Some("proj1".into()),
        walltime: Some("01:00:00".into()),
        gpus_per_node: Some(4),
        modules: vec!["cuda/12.4".into()],
        env: BTreeMap::from([("HF_HOME".to_string(), "/data/hf cache".to_string())]),
        ..ScriptConfig::default()
    };
    let s = render_job_script(Backend::Slurm, &cfg, &job(vec![42])).unwrap();
    let expected = "#!/bin/bash
#SBATCH --job-name=embed-b000042
#SBATCH --partition=debug
#SBATCH --account=proj1
#SBATCH --time=01:00:00
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --output=/runs/my run/logs/b42.log
#SBATCH --no-requeue
module load cuda/12.4
export HF_HOME='/data/hf cache'
embedfleet embed-job --run-dir '/runs/my run' --batch 42
rc=$?
rm -f '/runs/my run/done/b42.tmp'; (set -C; printf '%s\\n' \"$rc\" > '/runs/my run/done/b42.tmp') && mv -f '/runs/my run/done/b42.tmp' '/runs/my run/done/b42' || rm -f '/runs/my run/done/b42.tmp'
exit $rc
";
    assert_eq!(s, expected);
}

/// sbatch reads `%` in `--output` as a pattern (`%j`): a run directory with a `%` has it
/// doubled in Slurm's directives, and only there (PBS takes the path as it is).
#[test]
fn a_percent_in_the_run_directory_is_doubled_for_slurm_only() {
    let job = ScriptJob {
        output: "/runs/100%/logs/b42.log".into(),
        error: Some("/runs/100%/logs/b42.err".into()),
        ..job(vec![42])
    };
    let cfg = ScriptConfig::default();
    let s = render_job_script(Backend::Slurm, &cfg, &job).unwrap();
    assert!(
        s.contains("#SBATCH --output=/runs/100%%/logs/b42.log\n"),
        "{s}"
    );
    assert!(
        s.contains("#SBATCH --error=/runs/100%%/logs/b42.err\n"),
        "{s}"
    );
    let s = render_job_script(Backend::Pbs, &cfg, &job).unwrap();
    assert!(
        s.contains("/runs/100%/logs/b42.log") && !s.contains("%%"),
        "{s}"
    );
}

#[test]
fn pbs_builtin_template_polaris_style() {
    let cfg = ScriptConfig {
        account: Some("EmbedProj".into()),
        walltime: Some("01:00:00".into()),
        select_extra: Some("system=polaris".into()),
        extra_directives: vec![
            "#PBS -l filesystems=home:eagle".into(),
            "#PBS -l place=scatter".into(),
        ],
        ..ScriptConfig::default()
    };
    let s = render_job_script(Backend::Pbs, &cfg, &job(vec![42])).unwrap();
    for line in [
        "#PBS -N embed-b000042\n",
        "#PBS -q debug\n",
        "#PBS -A EmbedProj\n",
        "#PBS -l walltime=01:00:00\n",
        "#PBS -l select=1:system=polaris\n",
        "#PBS -j oe\n",
        "#PBS -l filesystems=home:eagle\n#PBS -l place=scatter\n",
        "cd \"${PBS_O_WORKDIR:-.}\"\n",
    ] {
        assert!(s.contains(line), "missing {line:?} in:\n{s}");
    }
    assert!(!s.contains("#PBS -e"), "{s}");
}

#[test]
fn multi_node_jobs_launch_one_embed_job_per_node() {
    let cfg = ScriptConfig::default();
    let s = render_job_script(Backend::Slurm, &cfg, &job(vec![7, 8, 9])).unwrap();
    assert!(s.contains("#SBATCH --nodes=3\n"), "{s}");
    assert!(
        s.contains("srun --nodes=3 --ntasks=3 --ntasks-per-node=1 bash -c "),
        "{s}"
    );
    assert!(s.contains("${b[$r]}") && !s.contains(":-0}"), "{s}");
    assert!(s.contains(" _ 7 8 9\n"), "{s}");
    let p = render_job_script(Backend::Pbs, &cfg, &job(vec![7, 8])).unwrap();
    assert!(
        p.contains("#PBS -l select=2\n") && p.contains("mpiexec -n 2 --ppn 1 bash -c "),
        "{p}"
    );
}

/// Runs the Slurm script of a 3-node job of batches 7, 8, 9 whose launcher is a fake that
/// starts the task three times, once per `task` line (each line sets that task's rank, or
/// not); the fake embedfleet records its arguments. Returns the script's exit code, the calls
/// and the marker.
fn run_multi_node(tasks: [&str; 3]) -> (i32, String, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let launcher = dir.path().join("launch");
    let mut fake_launcher = "#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\n".to_string();
    for t in tasks {
        fake_launcher.push_str(&format!("( {t} \"$@\" ) || exit $?\n"));
    }
    std::fs::write(&launcher, fake_launcher).unwrap();
    let fake = dir.path().join("fake-embedfleet");
    std::fs::write(
        &fake,
        "#!/bin/bash\necho \"$@\" >> \"$(dirname \"$0\")/calls\"\n",
    )
    .unwrap();
    for p in [&launcher, &fake] {
        std::process::Command::new("chmod")
            .arg("+x")
            .arg(p)
            .status()
            .unwrap();
    }
    let cfg = ScriptConfig {
        embedfleet: Some(fake.display().to_string()),
        launcher: Some(format!("{} --nodes=3", launcher.display())),
        ..ScriptConfig::default()
    };
    let mut j = job(vec![7, 8, 9]);
    j.run_dir = dir.path().to_path_buf();
    j.marker = Some(dir.path().join("marker"));
    let script = render_job_script(Backend::Slurm, &cfg, &j).unwrap();
    // The job step's own SLURM_PROCID is 0: no task may take it for its rank.
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .env("SLURM_PROCID", "0")
        .output()
        .unwrap();
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
    (
        out.status.code().unwrap(),
        read("calls").replace(&dir.path().display().to_string(), "RUN"),
        read("marker"),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn multi_node_line_picks_the_batch_of_its_rank() {
    let expected = "embed-job --run-dir RUN --batch 7\nembed-job --run-dir RUN --batch 8\nembed-job --run-dir RUN --batch 9\n";
    // srun's SLURM_PROCID, and the MPI launchers' own variables.
    for tasks in [
        ["SLURM_PROCID=0", "SLURM_PROCID=1", "SLURM_PROCID=2"],
        ["PMI_RANK=0", "PMIX_RANK=1", "PALS_RANKID=2"],
        [
            "OMPI_COMM_WORLD_RANK=0",
            "OMPI_COMM_WORLD_RANK=1",
            "OMPI_COMM_WORLD_RANK=2",
        ],
    ] {
        let (code, calls, marker, stderr) = run_multi_node(tasks);
        assert_eq!(
            (code, calls.as_str(), marker.as_str()),
            (0, expected, "0\n"),
            "{tasks:?}: {stderr}"
        );
    }
}

#[test]
fn a_multi_node_task_without_a_rank_refuses_to_start_instead_of_taking_the_first_batch() {
    // A launcher that sets no rank at all (the job step's SLURM_PROCID=0 is not taken for one),
    // and one whose rank is past the job's batches.
    for tasks in [
        ["env", "env", "env"],
        ["SLURM_PROCID=0", "SLURM_PROCID=1", "SLURM_PROCID=3"],
    ] {
        let (code, calls, marker, stderr) = run_multi_node(tasks);
        assert_eq!(code, 4, "{tasks:?}: {stderr}");
        assert_eq!(marker, "4\n");
        assert!(!calls.contains("--batch 9"), "{calls}");
        assert!(
            stderr.contains("has no rank") && stderr.contains("launcher"),
            "{stderr}"
        );
    }
    let (_, calls, _, _) = run_multi_node(["env", "env", "env"]);
    assert_eq!(calls, "", "no task ran an embed job");
}

#[test]
fn slurm_jobs_ask_not_to_be_requeued_and_pbs_jobs_to_be_rerunnable() {
    // A requeued Slurm job would race the replacement the submit loop already sent.
    let cfg = ScriptConfig::default();
    let s = render_job_script(Backend::Slurm, &cfg, &job(vec![1])).unwrap();
    assert!(s.contains("#SBATCH --no-requeue\n"), "{s}");
    // PBS Pro preempts (preempt_order R) and survives a MOM restart only by rerunning a job,
    // the same job id: the loop follows it through (see PBS_TEMPLATE).
    let p = render_job_script(Backend::Pbs, &cfg, &job(vec![1])).unwrap();
    assert!(p.contains("#PBS -r y\n"), "{p}");
}

#[test]
fn user_template_with_unknown_placeholder_is_a_clear_error() {
    let cfg = ScriptConfig {
        template: Some("#!/bin/bash\n#SBATCH -p {queue}\n#SBATCH --qos={qos}\n{command}\n".into()),
        ..ScriptConfig::default()
    };
    let err = render_job_script(Backend::Slurm, &cfg, &job(vec![1])).unwrap_err();
    let TemplateError::UnknownPlaceholder { name, line, known } = &err else {
        panic!("wrong error {err:?}");
    };
    assert_eq!((name.as_str(), *line), ("qos", 3));
    assert!(known.iter().any(|k| k == "queue") && known.iter().any(|k| k == "batch"));
    let msg = err.to_string();
    assert!(
        msg.contains("{qos}") && msg.contains("queue") && msg.contains("run_dir"),
        "{msg}"
    );
}

#[test]
fn user_template_overrides_builtin() {
    let cfg = ScriptConfig {
        template: Some("#!/bin/sh\n# {job_name} on {queue}\nexec {embedfleet} embed-job --run-dir {run_dir} --batch {batch}\n".into()),
        ..ScriptConfig::default()
    };
    let s = render_job_script(Backend::Pbs, &cfg, &job(vec![5])).unwrap();
    // The path with a space is one shell word.
    assert_eq!(s, "#!/bin/sh\n# embed-b000042 on debug\nexec embedfleet embed-job --run-dir '/runs/my run' --batch 5\n");
}

#[test]
fn values_that_would_break_the_script_are_rejected() {
    let cfg = ScriptConfig {
        account: Some("a\n#SBATCH --x".into()),
        ..ScriptConfig::default()
    };
    assert!(matches!(
        render_job_script(Backend::Slurm, &cfg, &job(vec![1])),
        Err(TemplateError::BadValue { .. })
    ));
    let mut j = job(vec![1]);
    j.queue = "debug prod".into();
    assert!(render_job_script(Backend::Slurm, &ScriptConfig::default(), &j).is_err());
    assert!(render_job_script(Backend::Slurm, &ScriptConfig::default(), &job(vec![])).is_err());
}

#[test]
fn builtin_templates_only_use_known_placeholders() {
    let vars = embedfleet_orchestrator::scheduler::script_vars(
        Backend::Pbs,
        &ScriptConfig::default(),
        &job(vec![1]),
    )
    .unwrap();
    for t in [
        embedfleet_orchestrator::scheduler::SLURM_TEMPLATE,
        embedfleet_orchestrator::scheduler::PBS_TEMPLATE,
        embedfleet_orchestrator::scheduler::LOCAL_TEMPLATE,
    ] {
        for name in template::placeholders(t) {
            assert!(vars.contains_key(&name), "{name}");
        }
    }
}

// ---------------------------------------------------------------- config

#[test]
fn config_from_toml() {
    let text = r#"
backend = "pbs"
[command]
timeout_secs = 30
retries = 5
[pbs]
flavor = "torque"
[pbs.qsub]
path = "/opt/pbs/bin/qsub"
extra_args = ["-l", "filesystems=home:eagle"]
[slurm]
use_sacct = "never"
[script]
account = "EmbedProj"
walltime = "01:00:00"
modules = ["conda"]
template = """
#!/bin/bash
{command}
"""
[script.env]
OMP_NUM_THREADS = "8"
"#;
    let cfg: SchedulerConfig = toml::from_str(text).unwrap();
    assert_eq!(cfg.backend, Backend::Pbs);
    assert_eq!(cfg.command.timeout_secs, 30.0);
    assert_eq!(cfg.command.retries, 5);
    assert_eq!(
        cfg.command.backoff_max_secs, 30.0,
        "unset fields keep defaults"
    );
    assert_eq!(cfg.pbs.flavor, PbsFlavor::Torque);
    assert_eq!(cfg.pbs.qsub.path, Some("/opt/pbs/bin/qsub".into()));
    assert_eq!(
        cfg.pbs.qsub.extra_args,
        vec!["-l", "filesystems=home:eagle"]
    );
    assert_eq!(cfg.slurm.use_sacct, SacctMode::Never);
    assert_eq!(cfg.script.nodes, 1);
    assert_eq!(cfg.script.env["OMP_NUM_THREADS"], "8");
    assert_eq!(
        cfg.script.template.as_deref(),
        Some("#!/bin/bash\n{command}\n")
    );
    assert_eq!(cfg.build().backend(), Backend::Pbs);
    let empty: SchedulerConfig = toml::from_str("").unwrap();
    assert_eq!(empty, SchedulerConfig::default());
    assert_eq!(empty.backend, Backend::Local);
    assert!(toml::from_str::<SchedulerConfig>("backend = \"lsf\"").is_err());
}

#[test]
fn squeue_start_estimates_are_local_times_and_na_is_no_estimate() {
    use embedfleet_orchestrator::scheduler::parse_start_estimates;
    let text = "101|2026-12-03T20:15:00\n102|N/A\n103|2026-12-03T21:15:00\n104|soon\n105_2|2026-12-04T00:00:05\n";
    let got = parse_start_estimates(text);
    let ids: Vec<&str> = got.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["101", "103", "105_2"]);
    // An hour apart, whatever this host's zone (no daylight-saving change on that evening).
    assert_eq!(got[1].1 - got[0].1, 3600.0);
    assert_eq!(got[2].1 - got[0].1, 3.0 * 3600.0 + 45.0 * 60.0 + 5.0);
}

#[test]
fn sbatch_test_only_says_when_a_job_not_yet_sent_would_start() {
    use embedfleet_orchestrator::scheduler::{parse_start_estimates, parse_test_only};
    let said = "sbatch: Job 12 to start at 2026-12-03T20:15:00 using 1 processors on nodes vm in partition debug\n";
    let at = parse_test_only(said).unwrap();
    let squeue = parse_start_estimates("1|2026-12-03T20:15:00\n");
    assert_eq!(at, squeue[0].1, "the same local time as squeue --start's");
    for refused in [
        "sbatch: error: invalid partition specified: nosuch\nallocation failure: Invalid partition name specified\n",
        "",
        "sbatch: Job 12 to start at soon using 1 processors\n",
    ] {
        assert_eq!(parse_test_only(refused), None, "{refused:?}");
    }
}

#[test]
fn pbs_pro_estimated_start_times_are_read_from_qstat_text_and_json() {
    use embedfleet_orchestrator::scheduler::{parse_qstat_json, parse_qstat_text};
    let text = "Job Id: 2871010.polaris-pbs-01\n    Job_Name = ef-b1\n    job_state = Q\n    queue = prod\n    estimated.exec_vnode = (x3005c0s13b0n0:ncpus=64)\n    estimated.start_time = Thu Dec  3 20:15:00 2026\n\nJob Id: 2871011.polaris-pbs-01\n    Job_Name = ef-b2\n    job_state = Q\n    queue = prod\n";
    let jobs = parse_qstat_text(text).unwrap();
    assert_eq!(jobs.len(), 2);
    let first = jobs[0].estimated_start_s().unwrap();
    assert_eq!(jobs[1].estimated_start_s(), None, "no estimate: none");
    let json = r#"{"Jobs": {"2871012.polaris-pbs-01": {"job_state": "Q",
        "estimated": {"exec_vnode": "(x1:ncpus=64)", "start_time": "Thu Dec  3 21:15:00 2026"}},
        "2871013.polaris-pbs-01": {"job_state": "Q", "estimated": {"start_time": 1796342400}}}}"#;
    let jobs = parse_qstat_json(json).unwrap();
    let by_id = |id: &str| {
        jobs.iter()
            .find(|j| j.id == id)
            .unwrap()
            .estimated_start_s()
    };
    // An hour after the text one, whatever this host's zone.
    assert_eq!(by_id("2871012.polaris-pbs-01").unwrap() - first, 3600.0);
    assert_eq!(by_id("2871013.polaris-pbs-01"), Some(1796342400.0));
}
