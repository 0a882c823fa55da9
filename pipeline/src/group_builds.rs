//! `submit --group-builds QUEUE`: each group's Qdrant shard built in a CPU job of its own as
//! soon as the group's batches are done, driven by the submit loop between its rounds
//! ([`FollowUp`]). The owner writes what a group is built from
//! ([`GroupBuildRequest`], `snapshots/requests/group-<n>.json`) and submits
//! `build-shard --request FILE` through the run's scheduler (or as a local process with
//! `local`); the job never opens run.db. Whether a group is built is decided by its manifest
//! (the digest of its sources and tombstones), never by the job's exit status, exactly as the
//! load decides it, so a load after the loop finds every group built.
//!
//! Each round costs one range count per group in run.db and one scheduler poll of the open
//! build jobs; a group's shards are read only when it becomes ready (or its done count
//! changes: a corpus update planned more batches into it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use embedfleet_core::rundb::RunDb;
use embedfleet_core::RunLayout;
use embedfleet_orchestrator::oneshot::{cpu_job_config, OneShot, OneShotJob};
use embedfleet_orchestrator::scheduler::{Backend, JobState, Scheduler, SchedulerConfig};
use embedfleet_orchestrator::submit::{FollowUp, FollowUpRound};
use embedfleet_snapshot::{GroupBuildRequest, ShardKeys};

use crate::error::{io, Result};
use crate::job_record;
use crate::settings::GroupBuildsSetting;

/// What the loop keeps of each group.
#[derive(Debug, Default)]
struct GroupState {
    /// Its done-batch count when its shard was last found built (built for that count).
    built_at: Option<i64>,
    job: Option<OneShotJob>,
    /// Since when the scheduler has not known the open job (and it left no marker).
    unknown_since: Option<Instant>,
    /// Build jobs that ended without building it, in this loop.
    failures: u32,
}

impl GroupState {
    fn open(&self) -> bool {
        self.job.is_some()
    }
}

/// The follow-up work of `submit --group-builds`.
pub struct GroupBuilds {
    run_dir: PathBuf,
    layout: RunLayout,
    keys: ShardKeys,
    /// The run's scheduler settings (the CPU job's are derived per group: memory).
    config: SchedulerConfig,
    scheduler: Box<dyn Scheduler>,
    queue: String,
    cpus: u32,
    exe: PathBuf,
    max_attempts: u32,
    lost_after: Duration,
    groups: BTreeMap<i64, GroupState>,
    /// The last error a round said: the same one is not said again each round.
    last_error: Option<String>,
}

impl GroupBuilds {
    /// `setting.queue` of the run's scheduler `config` (`local`: processes on this host);
    /// the run's keys pinned at `group_count` groups unless they are pinned already. Open build
    /// jobs of an earlier loop (their records beside the requests) are adopted.
    pub fn new(
        db: &RunDb,
        run_dir: &Path,
        config: &SchedulerConfig,
        setting: &GroupBuildsSetting,
        group_count: Option<i64>,
        max_attempts: u32,
        lost_after: Duration,
    ) -> Result<Self> {
        let run_dir =
            std::path::absolute(run_dir).map_err(io("find the absolute path of", run_dir))?;
        let layout = RunLayout::new(&run_dir);
        let keys = crate::shard_keys::for_group_builds(
            db,
            group_count,
            crate::error::GroupStep::SubmitGroupBuilds,
        )?;
        let mut config = config.clone();
        let queue = if setting.queue == "local" {
            config.backend = Backend::Local;
            "local".to_string()
        } else {
            setting.queue.clone()
        };
        let scheduler = config.build();
        let mut builds = Self {
            run_dir,
            layout,
            keys,
            config,
            scheduler,
            queue,
            cpus: setting.cpus,
            exe: crate::current_exe()?,
            max_attempts: max_attempts.max(1),
            lost_after,
            groups: BTreeMap::new(),
            last_error: None,
        };
        builds.adopt(db)?;
        Ok(builds)
    }

    /// How the run's batches are grouped.
    pub fn keys(&self) -> &ShardKeys {
        &self.keys
    }

    fn record_path(&self, group: i64) -> PathBuf {
        GroupBuildRequest::path(&self.layout, group).with_extension("job.json")
    }

    /// The build jobs an earlier loop left queued or running.
    fn adopt(&mut self, db: &RunDb) -> Result<()> {
        for group in 1..=self.group_count(db)? {
            let record = job_record::recorded(&self.record_path(group), self.scheduler.as_ref());
            if let Some(job_record::Recorded { job, open: Some(_) }) = record {
                self.groups.entry(group).or_default().job = Some(job);
            }
        }
        Ok(())
    }

    fn group_count(&self, db: &RunDb) -> Result<i64> {
        let last = db.last_batch_id()?;
        Ok(if last == 0 {
            0
        } else {
            self.keys.group_of(last)
        })
    }

    /// One round; errors are the caller's to show.
    fn try_round(&mut self, db: &RunDb, paused: bool, said: &mut Vec<String>) -> Result<bool> {
        let mut busy = self.poll(said)?;
        // What groups leave out (tombstones, rows later releases withheld): read once a round,
        // and only when a group is to be looked at.
        let mut tombstones = None;
        for group in 1..=self.group_count(db)? {
            let (first, last) = self.keys.batches_of(group);
            let (done, total) = db.batches_done_in(first, last)?;
            let state = self.groups.entry(group).or_default();
            if state.open() {
                continue;
            }
            if total == 0 || done < total || state.built_at == Some(done) {
                continue;
            }
            if state.failures >= self.max_attempts {
                continue;
            }
            let tombstones = match &mut tombstones {
                Some(t) => t,
                none => none.insert(embedfleet_vectordb::integrity::Tombstones::read(db)?),
            };
            let Some(request) =
                GroupBuildRequest::of_group(db, &self.layout, &self.keys, tombstones, group)?
            else {
                continue;
            };
            if request.built(&self.layout)?.is_some() {
                state.built_at = Some(done);
                continue;
            }
            if paused {
                busy = true;
                continue;
            }
            let job = self.submit(&request)?;
            said.push(format!(
                "group {group} ({}): {} points ready; build job {} ({}) submitted to {} queue {} with {} cores, {} MiB; log: {}",
                embedfleet_snapshot::describe_batches(request.batches),
                request.points,
                job.name,
                job.scheduler_id,
                job.backend,
                job.queue,
                self.cpus,
                request.memory_mib(),
                job.log.display()
            ));
            let state = self.groups.entry(group).or_default();
            state.job = Some(job);
            state.unknown_since = None;
            busy = true;
        }
        Ok(busy)
    }

    /// Polls the open build jobs at once; settles the ended ones. True while any is open.
    fn poll(&mut self, said: &mut Vec<String>) -> Result<bool> {
        let open: Vec<(i64, OneShotJob)> = self
            .groups
            .iter()
            .filter_map(|(g, s)| Some((*g, s.job.clone()?)))
            .collect();
        if open.is_empty() {
            return Ok(false);
        }
        let handles: Vec<_> = open.iter().map(|(_, j)| j.handle()).collect();
        let states = match self.scheduler.poll(&handles) {
            Ok(states) => states,
            // A scheduler that does not answer now is asked again next round.
            Err(e) if e.is_transient() => return Ok(true),
            Err(e) => return Err(e.into()),
        };
        let mut any_open = false;
        for ((group, job), handle) in open.into_iter().zip(&handles) {
            let state = states.get(&handle.id).cloned().unwrap_or(JobState::Unknown);
            let entry = self.groups.entry(group).or_default();
            let ended = match &state {
                JobState::Pending | JobState::Running => {
                    entry.unknown_since = None;
                    false
                }
                JobState::Unknown => {
                    let since = *entry.unknown_since.get_or_insert_with(Instant::now);
                    since.elapsed() >= self.lost_after
                }
                _ => true,
            };
            if !ended {
                any_open = true;
                continue;
            }
            if matches!(state, JobState::Unknown) {
                let _ = self.scheduler.cancel(&handle.clone());
            }
            entry.job = None;
            entry.unknown_since = None;
            // Built or not is the manifest's to say: the request as it was submitted.
            let request = GroupBuildRequest::read(&GroupBuildRequest::path(&self.layout, group))?;
            match request.built(&self.layout)? {
                Some(manifest) => said.push(format!(
                    "group {group}: built by {} in {:.1} s ({} points, {:.1} MB)",
                    job.name,
                    manifest.timings.total_s,
                    manifest.points,
                    manifest.snapshot_bytes as f64 / 1e6
                )),
                None => {
                    entry.failures += 1;
                    let what = if entry.failures >= self.max_attempts {
                        format!(
                            "given up after {} jobs; `upload --mode snapshot` builds it on this host",
                            entry.failures
                        )
                    } else {
                        "it is submitted again".to_string()
                    };
                    said.push(format!(
                        "group {group}: build job {} ended ({state}) without building it; {what}. Its log: {}",
                        job.name,
                        job.log.display()
                    ));
                }
            }
        }
        Ok(any_open)
    }

    fn submit(&self, request: &GroupBuildRequest) -> Result<OneShotJob> {
        let path = request.write(&self.layout)?;
        let config = cpu_job_config(&self.config, self.cpus, request.memory_mib());
        let kind = format!("g{}-a", request.group);
        let one = OneShot {
            run_dir: &self.run_dir,
            scheduler: &config,
            exe: &self.exe,
            queue: &self.queue,
            kind: &kind,
            attempt: 1,
            args: vec![
                "build-shard".into(),
                "--run-dir".into(),
                self.run_dir.display().to_string(),
                "--request".into(),
                path.display().to_string(),
            ],
        };
        job_record::submit(
            one,
            self.scheduler.as_ref(),
            &self.record_path(request.group),
        )
    }
}

impl FollowUp for GroupBuilds {
    fn round(&mut self, db: &RunDb, paused: bool) -> FollowUpRound {
        let mut said = Vec::new();
        let busy = match self.try_round(db, paused, &mut said) {
            Ok(busy) => {
                self.last_error = None;
                busy
            }
            Err(e) => {
                let text = embedfleet_core::cause::chain_line(&e);
                if self.last_error.as_ref() != Some(&text) {
                    said.push(format!(
                        "group builds: {text}; tried again each round (`upload --mode snapshot` builds what is left)"
                    ));
                    self.last_error = Some(text);
                }
                // Open jobs are still polled next round; a failing read does not end the loop
                // while they run.
                self.groups.values().any(GroupState::open)
            }
        };
        FollowUpRound { busy, said }
    }
}
