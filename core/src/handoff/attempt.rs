//! Result manifests: what one attempt at a batch made, written by the embed job for the owner.

use super::{read_json, write_json, HandoffError, OutputSettings};
use crate::shardfile::ShardCheckError;
use crate::RunLayout;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The manifest format this embedfleet writes and reads (2: the plan id and each part's
/// paper digest; a format-1 manifest has neither and is never accepted).
pub const MANIFEST_FORMAT: u32 = 2;

/// The study's per-batch breakdown and what the job had to do to finish.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchTimings {
    pub model_load_s: f64,
    /// Reading the batch file and writing shards.
    pub io_s: f64,
    pub tokenize_s: f64,
    pub inference_s: f64,
    pub total_s: f64,
    pub papers: u64,
    pub tokens: u64,
    /// Tokens a padded forward would have spent on padding (the model itself packs).
    pub padding_tokens: u64,
    /// Mini-batches split in halves after an out-of-memory.
    pub fallback_split: u64,
    /// Papers embedded alone after an out-of-memory.
    pub fallback_sequential: u64,
    /// Papers embedded in chunks because even alone they did not fit.
    pub fallback_chunked: u64,
    /// Papers longer than the context, embedded in chunks.
    pub long_chunked: u64,
    pub peak_memory_bytes: Option<u64>,
}

/// One parquet shard an attempt made (or took over from an earlier attempt of the batch).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptShard {
    pub part: u32,
    /// Relative to the run directory.
    pub file: String,
    pub rows: u64,
    pub sha256: String,
    /// Papers of the part that could not be embedded: (paper id, why).
    pub failed: Vec<(String, String)>,
    /// [`papers_digest`] of the part's paper ids, embedded and failed.
    #[serde(default)]
    pub papers: String,
    /// When it was written (unix seconds): the live view's progress and stall yardstick.
    /// Absent in manifests of older embedfleets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_unix_s: Option<f64>,
}

impl AttemptShard {
    /// Checks the shard against the part it stands for: its file is the one an attempt
    /// `attempt` of `batch` writes for its part (nothing else is ever opened: a manifest is
    /// not trusted to name files), it is there with its recorded rows and sha256, and the
    /// paper ids in it, with the failed ones, are exactly the part's (`expected` digest).
    pub fn verify(
        &self,
        layout: &RunLayout,
        batch: i64,
        attempt: &str,
        expected: &str,
    ) -> Result<(), Verdict> {
        let own = RunLayout::shard_file_name(batch, self.part, attempt);
        if self.file != own {
            return Err(Verdict::Wrong(format!(
                "part {} names the file {:?}, not its own {own}",
                self.part, self.file
            )));
        }
        if self.papers != expected {
            return Err(Verdict::Wrong(format!(
                "part {} is said to hold other papers than the plan gives it",
                self.part
            )));
        }
        let ids = crate::shardfile::check_recorded(
            &layout.resolve(&self.file),
            &self.file,
            self.rows,
            &self.sha256,
        )
        .map_err(|e| match e {
            ShardCheckError::Unreadable(why) => Verdict::Unreadable(why),
            ShardCheckError::Wrong(why) => Verdict::Wrong(why),
        })?;
        let failed = self.failed.iter().map(|(id, _)| id.as_str());
        if papers_digest(ids.iter().map(String::as_str).chain(failed)) != expected {
            return Err(Verdict::Wrong(format!(
                "shard {} does not hold the part's papers (one missing, doubled or another's)",
                self.file
            )));
        }
        Ok(())
    }
}

/// What a batch's result must match: the plan it was made for, and each part's papers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedBatch {
    pub plan_id: String,
    /// [`papers_digest`] of each part, in part order.
    pub parts: Vec<String>,
}

impl ExpectedBatch {
    /// The expected result of a batch whose papers to embed are `ids`, in row order, cut into
    /// parts of `shard_papers` (as the embed job cuts them).
    pub fn new<'a>(
        plan_id: &str,
        ids: impl IntoIterator<Item = &'a str>,
        shard_papers: usize,
    ) -> Self {
        let ids: Vec<&str> = ids.into_iter().collect();
        Self {
            plan_id: plan_id.to_string(),
            parts: ids
                .chunks(shard_papers.max(1))
                .map(|part| papers_digest(part.iter().copied()))
                .collect(),
        }
    }

    pub fn part_count(&self) -> usize {
        self.parts.len()
    }
}

/// A digest of a set of paper ids (sorted, so the order they were written in does not
/// matter; a doubled or missing id changes it): hex SHA-256 of the ids, one per line.
pub fn papers_digest<'a>(ids: impl IntoIterator<Item = &'a str>) -> String {
    use sha2::{Digest, Sha256};
    let mut ids: Vec<&str> = ids.into_iter().collect();
    ids.sort_unstable();
    let mut hasher = Sha256::new();
    for id in ids {
        hasher.update(id.as_bytes());
        hasher.update(b"\n");
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Why an attempt's result was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Something could not be read now (a shared filesystem's ESTALE or EIO): try again at the
    /// next poll and record nothing.
    Unreadable(String),
    /// Read whole and found wrong: the attempt is rejected.
    Wrong(String),
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Unreadable(why) | Verdict::Wrong(why) => f.write_str(why),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptManifest {
    pub format: u32,
    /// The plan the attempt embedded (`plan.json`'s id): a result of another plan of the same
    /// directory (a lost run.db, planned again) is never taken for this one's.
    #[serde(default)]
    pub plan_id: String,
    pub batch: i64,
    /// This attempt's token: in its file names, so attempts never touch each other's files.
    pub attempt: String,
    /// The scheduler job it ran in, when it knows: its name and id, as `NAME (ID)`
    /// (`EMBEDFLEET_JOB_NAME` of local jobs, `SLURM_JOB_NAME`/`SLURM_JOB_ID`,
    /// `PBS_JOBNAME`/`PBS_JOBID`).
    pub job: Option<String>,
    pub host: String,
    pub devices: String,
    pub settings: OutputSettings,
    /// Parts (shards) the batch has under these settings.
    pub parts: u32,
    /// The shards so far, in part order.
    pub shards: Vec<AttemptShard>,
    /// Every part is in `shards`: the batch is done if the owner verifies it.
    pub complete: bool,
    /// Why the attempt stopped, when it failed.
    pub error: Option<String>,
    pub timings: BatchTimings,
    pub started_unix_s: f64,
    pub finished_unix_s: Option<f64>,
}

impl AttemptManifest {
    /// A new attempt at `batch` with nothing made yet.
    pub fn start(
        plan_id: &str,
        batch: i64,
        devices: String,
        settings: OutputSettings,
        parts: u32,
    ) -> Self {
        Self {
            format: MANIFEST_FORMAT,
            plan_id: plan_id.to_string(),
            batch,
            attempt: new_attempt_token(),
            job: job_from_env(),
            host: crate::host::name(),
            devices,
            settings,
            parts,
            shards: Vec::new(),
            complete: false,
            error: None,
            timings: BatchTimings::default(),
            started_unix_s: unix_now(),
            finished_unix_s: None,
        }
    }

    /// Writes (or rewrites) the manifest, atomically.
    pub fn write(&self, layout: &RunLayout) -> Result<(), HandoffError> {
        write_json(&layout.attempt_manifest(self.batch, &self.attempt), self)
    }

    /// Marks the attempt ended (complete or with `error`) and writes it.
    pub fn finish(
        &mut self,
        layout: &RunLayout,
        error: Option<String>,
    ) -> Result<(), HandoffError> {
        self.complete = error.is_none() && self.shards.len() as u32 == self.parts;
        self.error = error;
        self.finished_unix_s = Some(unix_now());
        self.write(layout)
    }

    /// Checks that this is a whole, intact result for its batch: complete, made for the run's
    /// plan with the run's `settings`, one shard per part, each shard its own attempt's file,
    /// there with its recorded rows and sha256, holding exactly the part's papers (`expected`).
    /// A read error is [`Verdict::Unreadable`], not a verdict on the attempt.
    pub fn verify(
        &self,
        layout: &RunLayout,
        expected: &ExpectedBatch,
        settings: Option<&OutputSettings>,
    ) -> Result<(), Verdict> {
        let wrong = |why: String| Err(Verdict::Wrong(why));
        if !self.complete {
            return wrong("the attempt did not finish".into());
        }
        if self.plan_id != expected.plan_id {
            return wrong(format!(
                "it was made for another plan ({}) than the run's ({}): a run directory planned again, or a result of another run",
                if self.plan_id.is_empty() { "none: an older embedfleet" } else { &self.plan_id },
                expected.plan_id
            ));
        }
        if let Some(run) = settings {
            let differences = crate::pin::Pinned::differences(run, &self.settings);
            if !differences.is_empty() {
                return wrong(format!(
                    "made with other settings than the run's: {}",
                    crate::pin::join(&differences)
                ));
            }
        }
        let parts = expected.part_count();
        let numbered = self
            .shards
            .iter()
            .enumerate()
            .all(|(i, s)| s.part == i as u32);
        if self.parts as usize != parts || self.shards.len() != parts || !numbered {
            return wrong(format!(
                "it has {} shards for parts 0..{}, the batch needs one for each of {parts} parts",
                self.shards.len(),
                self.parts
            ));
        }
        for (shard, digest) in self.shards.iter().zip(&expected.parts) {
            shard.verify(layout, self.batch, &self.attempt, digest)?;
        }
        Ok(())
    }

    /// The manifest of attempt `attempt` at `batch`.
    pub fn read(layout: &RunLayout, batch: i64, attempt: &str) -> Result<Self, HandoffError> {
        read_json(&layout.attempt_manifest(batch, attempt))
    }

    /// Every manifest of `batch`'s attempts, each read or with why it could not be.
    pub fn read_all(
        layout: &RunLayout,
        batch: i64,
    ) -> Vec<(PathBuf, Result<AttemptManifest, HandoffError>)> {
        let dir = layout.batch_results_dir(batch);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        paths.sort();
        paths
            .into_iter()
            .map(|p| {
                let read = read_json(&p);
                (p, read)
            })
            .collect()
    }
}

/// A token no other attempt has: from the host, the process, the time and a counter.
pub fn new_attempt_token() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(crate::host::name().as_bytes());
    h.update(&std::process::id().to_le_bytes());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    h.update(&nanos.to_le_bytes());
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    h.update(&n.to_le_bytes());
    format!("a{:011x}", h.digest() & 0xfff_ffff_ffff)
}

fn job_from_env() -> Option<String> {
    job_label(|k| std::env::var(k).ok())
}

/// `NAME (ID)`, `NAME` or `ID` of the scheduler job, from its environment (`var`).
fn job_label(var: impl Fn(&str) -> Option<String>) -> Option<String> {
    let first = |keys: &[&str]| keys.iter().find_map(|k| var(k).filter(|v| !v.is_empty()));
    let name = first(&["EMBEDFLEET_JOB_NAME", "SLURM_JOB_NAME", "PBS_JOBNAME"]);
    let id = first(&["SLURM_JOB_ID", "PBS_JOBID"]);
    match (name, id) {
        (Some(name), Some(id)) => Some(format!("{name} ({id})")),
        (name, id) => name.or(id),
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_is_named_by_whichever_scheduler_started_it() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            job_label(env(&[
                ("SLURM_JOB_NAME", "efab-b000001-a1"),
                ("SLURM_JOB_ID", "42")
            ])),
            Some("efab-b000001-a1 (42)".into())
        );
        assert_eq!(
            job_label(env(&[("EMBEDFLEET_JOB_NAME", "efab-b000002-a1")])),
            Some("efab-b000002-a1".into())
        );
        assert_eq!(
            job_label(env(&[("PBS_JOBID", "7.pbs")])),
            Some("7.pbs".into())
        );
        assert_eq!(job_label(env(&[])), None);
    }

    #[test]
    fn a_parts_digest_ignores_order_and_sees_a_doubled_or_missing_paper() {
        let part = papers_digest(["p1", "p2", "p3"]);
        assert_eq!(papers_digest(["p3", "p1", "p2"]), part);
        assert_ne!(
            papers_digest(["p1", "p1", "p3"]),
            part,
            "p1 twice, p2 dropped"
        );
        assert_ne!(papers_digest(["p1", "p2"]), part);
        // Ids are whole lines: two ids never read as one.
        assert_ne!(papers_digest(["p1p2"]), papers_digest(["p1", "p2"]));
        let expected = ExpectedBatch::new("p1", ["a", "b", "c", "d", "e"], 2);
        assert_eq!(expected.part_count(), 3);
        assert_eq!(expected.parts[2], papers_digest(["e"]));
    }

    #[test]
    fn tokens_differ_and_fit_a_file_name() {
        let a = new_attempt_token();
        let b = new_attempt_token();
        assert_ne!(a, b);
        assert_eq!(a.len(), 12);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()), "{a}");
    }
}
