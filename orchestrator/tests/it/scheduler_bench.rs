//! Scheduler backend overhead, printed rather than asserted (speed is not a test result).
//! Run: `cargo test -p embedfleet-orchestrator --release --test it scheduler_bench -- --ignored --nocapture --test-threads=1`
//! The Slurm one needs `.ci/slurm/start-local-slurm.sh`.

use std::time::Instant;

use embedfleet_orchestrator::scheduler::{
    CommandConfig, JobHandle, JobScript, JobSubmission, LocalConfig, LocalScheduler, Scheduler,
    SchedulerJobId, SlurmConfig, SlurmScheduler,
};

fn report(what: &str, n: usize, secs: f64) {
    println!(
        "{what}: {n} in {secs:.3} s = {:.1}/s, {:.2} ms each",
        n as f64 / secs,
        secs * 1e3 / n as f64
    );
}

#[test]
#[ignore = "benchmark"]
fn bench_local_submit_and_poll() {
    let s = LocalScheduler::new(LocalConfig::default());
    let n = 1000;
    let t = Instant::now();
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let job = JobSubmission::new(format!("b{i}"), "local", JobScript::Text("exit 0".into()));
        handles.push(JobHandle::new(s.submit(&job).unwrap()));
    }
    report("local submit", n, t.elapsed().as_secs_f64());
    let t = Instant::now();
    let rounds = 20;
    for _ in 0..rounds {
        assert_eq!(s.poll(&handles).unwrap().len(), n);
    }
    report(
        &format!("local poll of {n} jobs"),
        rounds,
        t.elapsed().as_secs_f64(),
    );
}

#[test]
#[ignore = "benchmark"]
fn bench_slurm_submit_and_poll() {
    let s = SlurmScheduler::new(SlurmConfig::default(), CommandConfig::default());
    let n = 100;
    let t = Instant::now();
    let mut handles = Vec::new();
    for i in 0..n {
        let job = JobSubmission::new(
            format!("efbench-{i}"),
            if i % 2 == 0 { "debug" } else { "gpu" },
            JobScript::Text("#!/bin/bash\ntrue\n".into()),
        )
        .workdir(std::env::temp_dir())
        .log("/dev/null");
        handles.push(JobHandle::new(s.submit(&job).unwrap()));
    }
    report("sbatch submit", n, t.elapsed().as_secs_f64());
    // Pad to a full corpus' 2,079 jobs with ids Slurm never had (finished and forgotten).
    for i in 0..(2079 - n) {
        handles.push(JobHandle::new(SchedulerJobId::new(
            (90_000_000 + i).to_string(),
        )));
    }
    let rounds = 5;
    let t = Instant::now();
    for _ in 0..rounds {
        assert_eq!(s.poll(&handles).unwrap().len(), handles.len());
    }
    report(
        &format!("slurm poll of {} jobs (squeue + sacct)", handles.len()),
        rounds,
        t.elapsed().as_secs_f64(),
    );
    let t = Instant::now();
    for _ in 0..rounds {
        s.poll(&handles[..n]).unwrap();
    }
    report(
        &format!("slurm poll of {n} known jobs"),
        rounds,
        t.elapsed().as_secs_f64(),
    );
}
