//! Result manifests: what one attempt at a batch made, written by the embed job for the owner.

use super::{read_json, write_json, HandoffError, OutputSettings};
use crate::rundb::BatchTimings;
use crate::RunLayout;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The manifest format this embedfleet writes and reads.
pub const MANIFEST_FORMAT: u32 = 1;

/// One parquet shard an attempt made (or took over from an earlier attempt of the batch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptShard {
    pub part: u32,
    /// Relative to the run directory.
    pub file: String,
    pub rows: u64,
    pub sha256: String,
    /// Papers of the part that could not be embedded: (paper id, why).
    pub failed: Vec<(String, String)>,
}

impl AttemptShard {
    /// The file is there, holds `rows` rows and has the recorded sha256.
    pub fn verify(&self, layout: &RunLayout) -> Result<(), String> {
        crate::shardfile::verify_recorded(
            &layout.resolve(&self.file),
            &self.file,
            self.rows,
            &self.sha256,
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptManifest {
    pub format: u32,
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
    pub fn start(batch: i64, devices: String, settings: OutputSettings, parts: u32) -> Self {
        Self {
            format: MANIFEST_FORMAT,
            batch,
            attempt: new_attempt_token(),
            job: job_from_env(),
            host: host_name(),
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

    /// Checks that this is a whole, intact result for its batch: complete, made with the run's
    /// `settings`, one shard per part, rows and failed papers adding up to the `papers` the
    /// batch has to embed, and every shard file there with its recorded rows and sha256.
    /// The error says what is wrong.
    pub fn verify(
        &self,
        layout: &RunLayout,
        papers: u64,
        settings: Option<&OutputSettings>,
    ) -> Result<(), String> {
        if !self.complete {
            return Err("the attempt did not finish".into());
        }
        if let Some(run) = settings {
            let differences = run.differences(&self.settings);
            if !differences.is_empty() {
                return Err(format!(
                    "made with other settings than the run's: {}",
                    differences.join("; ")
                ));
            }
        }
        let parts = papers.div_ceil(self.settings.shard_papers.max(1) as u64);
        let numbered = self
            .shards
            .iter()
            .enumerate()
            .all(|(i, s)| s.part == i as u32);
        if self.parts as u64 != parts || self.shards.len() as u64 != parts || !numbered {
            return Err(format!(
                "it has {} shards for parts 0..{}, the batch needs one for each of {parts} parts",
                self.shards.len(),
                self.parts
            ));
        }
        let counted: u64 = self
            .shards
            .iter()
            .map(|s| s.rows + s.failed.len() as u64)
            .sum();
        if counted != papers {
            return Err(format!(
                "its shards hold {counted} papers (embedded or failed), the batch has {papers}"
            ));
        }
        for shard in &self.shards {
            shard.verify(layout)?;
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
    h.update(host_name().as_bytes());
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

/// This machine's name.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
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
    fn tokens_differ_and_fit_a_file_name() {
        let a = new_attempt_token();
        let b = new_attempt_token();
        assert_ne!(a, b);
        assert_eq!(a.len(), 12);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()), "{a}");
    }
}
