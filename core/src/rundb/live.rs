//! The live view of a run: what each running job is doing now, per host, read from the result
//! manifests the embed jobs rewrite after every shard — no job reports anything else, and no
//! job opens run.db. Only the open jobs' batches are read: the cost grows with the jobs
//! running, not with the batches of the run.
//!
//! A job is *stalled* when it has written nothing for several of its own shard times
//! ([`StallRule`]): a hung filesystem, a GPU stuck in a kernel, a deadlocked collective. The
//! view shows it and the submit loop says so; only `submit --kill-stalled` cancels it.

use super::error::Result;
use super::handle::RunDb;
use crate::handoff::AttemptManifest;
use crate::owner::unix_now;
use crate::state::JobStatus;
use serde::{Deserialize, Serialize};

/// The run.db setting with the stall rule the submit loop was started with.
pub const STALL_RULE_SETTING: &str = "stall_rule";

/// When a running attempt counts as stalled: no shard for `shard_times` times its typical time
/// per shard, and for at least `min_idle_s`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StallRule {
    pub shard_times: f64,
    pub min_idle_s: f64,
}

impl Default for StallRule {
    /// Four shard times, and ten minutes at least: a paper mix has slow shards (a few very
    /// long papers), and a model load of a 4B model takes half a minute to several minutes on
    /// a busy shared filesystem.
    fn default() -> Self {
        Self {
            shard_times: 4.0,
            min_idle_s: 600.0,
        }
    }
}

impl StallRule {
    /// How long an attempt may write nothing: its own typical shard time (or, before it has
    /// one, the run's) times `shard_times`, at least `min_idle_s`; with no yardstick at all,
    /// three times `min_idle_s` (the model load comes before the first shard).
    pub fn allowed_idle_s(&self, shard_time_s: Option<f64>) -> f64 {
        match shard_time_s {
            Some(t) => (self.shard_times * t).max(self.min_idle_s),
            None => 3.0 * self.min_idle_s,
        }
    }
}

/// One running attempt at a batch, as its manifest shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveAttempt {
    pub host: String,
    pub batch: i64,
    /// The scheduler job's name (run.db's).
    pub job: String,
    /// The id the scheduler gave the job (`1234.pbshost`, a Slurm job id, a pid), where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_id: Option<String>,
    pub attempt: String,
    pub shards_done: u32,
    pub parts: u32,
    /// Papers in the shards it has written (failed ones included).
    pub papers_done: u64,
    /// Over its last few shards (up to four); over its first shard alone before that.
    pub papers_per_second: Option<f64>,
    /// Seconds since its last shard; since its start before the first.
    pub idle_s: f64,
    /// Whether it has written a shard yet.
    pub has_shard: bool,
    /// Its typical (median) time between shards: the yardstick of a stall.
    pub shard_time_s: Option<f64>,
    /// Seconds of silence allowed before it counts as stalled.
    pub allowed_idle_s: f64,
    pub stalled: bool,
}

impl LiveAttempt {
    /// The job as a user looks for it: `NAME (ID)`, or its name before the scheduler's id is
    /// known.
    pub fn label(&self) -> String {
        match &self.scheduler_id {
            Some(id) => format!("{} ({id})", self.job),
            None => self.job.clone(),
        }
    }
}

impl RunDb {
    /// The stall rule of the run (the one its submit loop was started with, or the default).
    pub fn stall_rule(&self) -> Result<StallRule> {
        Ok(self.setting(STALL_RULE_SETTING)?.unwrap_or_default())
    }

    pub fn set_stall_rule(&self, rule: &StallRule) -> Result<()> {
        self.set_setting(STALL_RULE_SETTING, rule)
    }

    /// Every running attempt of an open job, by host and batch.
    pub fn live_attempts(&self) -> Result<Vec<LiveAttempt>> {
        let rule = self.stall_rule()?;
        let now = unix_now();
        let layout = self.layout();
        let mut found = Vec::new();
        // A job the scheduler still holds in its queue has no attempt yet: its folder is not
        // looked for (most of the open jobs of a busy run, at every poll).
        let started = self
            .open_jobs()?
            .into_iter()
            .filter(|j| !matches!(j.state, JobStatus::Pending | JobStatus::Submitting));
        for job in started {
            for (_, manifest) in AttemptManifest::read_all(&layout, job.batch_id) {
                // Unreadable now (being replaced, a read error): next poll.
                let Ok(manifest) = manifest else { continue };
                let ours = manifest.job.as_deref().is_some_and(|label| {
                    label == job.name
                        || label.starts_with(&format!("{} (", job.name))
                        || job.scheduler_id.as_deref() == Some(label)
                });
                if ours && manifest.finished_unix_s.is_none() {
                    found.push((job.name.clone(), job.scheduler_id.clone(), manifest));
                }
            }
        }
        let mut live: Vec<LiveAttempt> = found
            .into_iter()
            .map(|(job, id, m)| LiveAttempt {
                scheduler_id: id,
                ..measure(job, &m, now)
            })
            .collect();
        // Before its first shard an attempt is judged by the run's typical shard time.
        let mut typical: Vec<f64> = live.iter().filter_map(|a| a.shard_time_s).collect();
        let run_typical = median(&mut typical);
        for a in &mut live {
            a.allowed_idle_s = rule.allowed_idle_s(a.shard_time_s.or(run_typical));
            a.stalled = a.idle_s > a.allowed_idle_s;
        }
        live.sort_by(|a, b| (&a.host, a.batch).cmp(&(&b.host, b.batch)));
        Ok(live)
    }
}

/// Progress of one attempt from its manifest, at `now` (stall judged by the caller).
fn measure(job: String, m: &AttemptManifest, now: f64) -> LiveAttempt {
    // Shards this attempt wrote (not those it took over from an earlier one), in time order.
    let mut own: Vec<(f64, u64)> = m
        .shards
        .iter()
        .filter_map(|s| {
            let t = s.written_unix_s.filter(|&t| t >= m.started_unix_s)?;
            Some((t, s.rows + s.failed.len() as u64))
        })
        .collect();
    own.sort_by(|a, b| a.0.total_cmp(&b.0));
    let last = own.last().map(|&(t, _)| t).unwrap_or(m.started_unix_s);
    let mut gaps: Vec<f64> = own.windows(2).map(|w| w[1].0 - w[0].0).collect();
    let shard_time_s = match own.first() {
        _ if !gaps.is_empty() => median(&mut gaps),
        // One shard: its time, with the model load in it (too long, so a lenient yardstick).
        Some(&(t, _)) => Some(t - m.started_unix_s),
        None => None,
    };
    let papers_per_second = match own.len() {
        0 => None,
        1 => Some(own[0].1 as f64 / (own[0].0 - m.started_unix_s).max(1e-3)),
        n => {
            let k = (n - 1).min(4);
            let rows: u64 = own[n - k..].iter().map(|&(_, r)| r).sum();
            Some(rows as f64 / (own[n - 1].0 - own[n - 1 - k].0).max(1e-3))
        }
    };
    LiveAttempt {
        host: m.host.clone(),
        batch: m.batch,
        job,
        scheduler_id: None,
        attempt: m.attempt.clone(),
        shards_done: m.shards.len() as u32,
        parts: m.parts,
        papers_done: m
            .shards
            .iter()
            .map(|s| s.rows + s.failed.len() as u64)
            .sum(),
        papers_per_second,
        idle_s: (now - last).max(0.0),
        has_shard: !own.is_empty(),
        shard_time_s,
        allowed_idle_s: 0.0,
        stalled: false,
    }
}

fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some(values[values.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handoff::AttemptShard;

    fn manifest(started: f64, shard_times: &[f64]) -> AttemptManifest {
        let settings = crate::handoff::settings_for_tests(10);
        let mut m = AttemptManifest::start("plan", 3, "cpu".into(), settings, 8);
        m.started_unix_s = started;
        m.host = "node07".into();
        m.shards = shard_times
            .iter()
            .enumerate()
            .map(|(i, &t)| AttemptShard {
                part: i as u32,
                file: format!("shards/b3-{i}.x.parquet"),
                rows: 10,
                sha256: String::new(),
                failed: Vec::new(),
                papers: String::new(),
                written_unix_s: Some(t),
            })
            .collect();
        m
    }

    #[test]
    fn rate_and_shard_time_come_from_the_last_shards_not_the_model_load() {
        // Loaded for 60 s, then a shard every 10 s, the last 5 s ago.
        let a = measure(
            "j".into(),
            &manifest(1000.0, &[1060.0, 1070.0, 1080.0, 1090.0, 1100.0, 1110.0]),
            1115.0,
        );
        assert_eq!(a.shards_done, 6);
        assert_eq!(a.papers_done, 60);
        assert_eq!(a.shard_time_s, Some(10.0));
        assert_eq!(a.papers_per_second, Some(1.0)); // 40 papers in the last 40 s
        assert_eq!(a.idle_s, 5.0);
        assert!(a.has_shard);
    }

    #[test]
    fn stalled_after_several_of_its_own_shard_times_and_the_minimum() {
        let rule = StallRule {
            shard_times: 4.0,
            min_idle_s: 30.0,
        };
        assert_eq!(rule.allowed_idle_s(Some(10.0)), 40.0);
        assert_eq!(rule.allowed_idle_s(Some(1.0)), 30.0);
        assert_eq!(rule.allowed_idle_s(None), 90.0);
        let m = manifest(1000.0, &[1060.0, 1070.0, 1080.0]);
        assert!(measure("j".into(), &m, 1100.0).idle_s <= rule.allowed_idle_s(Some(10.0)));
        assert!(measure("j".into(), &m, 1130.0).idle_s > rule.allowed_idle_s(Some(10.0)));
    }

    #[test]
    fn shards_taken_over_from_an_earlier_attempt_are_not_its_own_progress() {
        // Two shards of an earlier attempt (before this one started), none of its own yet.
        let a = measure("j".into(), &manifest(2000.0, &[1500.0, 1510.0]), 2100.0);
        assert_eq!(a.shards_done, 2);
        assert!(!a.has_shard);
        assert_eq!(a.shard_time_s, None);
        assert_eq!(a.papers_per_second, None);
        assert_eq!(a.idle_s, 100.0);
    }
}
