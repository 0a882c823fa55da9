//! The numbers `embedfleet status` shows. Serialised as the stable `status --json` format
//! (docs/commands.md, "status --json"): fields are only ever added, and `format_version` goes
//! up when one that matters is.

use super::counts::{Counts, ReleaseWork};
use super::error::Result;
use super::handle::RunDb;
use super::queues::PauseReason;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const STATUS_FORMAT_VERSION: u32 = 2;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunStatus {
    pub format_version: u32,
    pub run_dir: String,
    pub schema_version: i64,
    /// `true` once every corpus file is planned and duplicates are resolved.
    pub plan_complete: bool,
    pub corpus_files: u64,
    pub corpus_files_planned: u64,
    /// Files that broke off mid-way, with where and why.
    pub corrupt_files: BTreeMap<String, String>,
    /// Papers to embed (batch rows less later duplicates).
    pub papers_planned: u64,
    pub chars_planned: u64,
    pub papers_filtered: u64,
    pub papers_quarantined: u64,
    pub quarantined_by_reason: BTreeMap<String, u64>,
    pub batches: u64,
    pub batches_by_state: BTreeMap<String, u64>,
    /// queue -> state -> jobs (latest attempt of each batch).
    pub jobs_by_queue: BTreeMap<String, BTreeMap<String, u64>>,
    pub shards: u64,
    pub rows_in_shards: u64,
    pub points_uploaded: u64,
    pub points_failed: u64,
    /// Queue -> cap on jobs queued + running (`submit --queue`, `queues set`).
    #[serde(default)]
    pub queue_caps: BTreeMap<String, u32>,
    /// `embedfleet pause` is in force: the submit loop submits nothing new.
    #[serde(default)]
    pub paused: bool,
    /// Why the submit loop paused the run by itself (its breaker: jobs in a row failed alike),
    /// with the failed jobs' logs and what to check; `null` when not paused or paused by
    /// `embedfleet pause`. `embedfleet resume` clears it.
    #[serde(default)]
    pub pause_reason: Option<PauseReason>,
    /// Papers embedded per second over the embed jobs' wall-clock span so far.
    #[serde(default)]
    pub papers_per_second: Option<f64>,
    /// Seconds until every planned paper is embedded at that rate.
    #[serde(default)]
    pub eta_seconds: Option<f64>,
    /// Tokens the finished embed runs fed the model.
    #[serde(default)]
    pub tokens_embedded: u64,
    /// collection -> its upload progress (added in format 1; absent before any upload).
    #[serde(default)]
    pub uploads_by_collection: BTreeMap<String, CollectionUpload>,
    /// Embed-job attempts by what the owner made of their result manifests: `accepted`,
    /// `discarded`, `rejected`, `failed`, `abandoned` (added in format 2's run.db v5; empty
    /// before any result was taken in).
    #[serde(default)]
    pub attempts_by_state: BTreeMap<String, u64>,
    /// Each running job's attempt as its manifest shows it: host, batch, shards, papers/s over
    /// its last shards, seconds since its last shard, and whether it is stalled (added in
    /// format 2; empty when nothing runs, or in a snapshot of an older embedfleet).
    #[serde(default)]
    pub live: Vec<super::LiveAttempt>,
    /// The corpus releases planned into the run (`plan --update`), oldest first, with what
    /// each changed and cost (added with run.db v9; one for a run never updated).
    #[serde(default)]
    pub releases: Vec<ReleaseStatus>,
    /// Papers the newest release serves: `papers_planned` less the rows later releases
    /// withheld. What a collection and a published dataset of the run hold.
    #[serde(default)]
    pub papers_live: u64,
    /// Rows of the run's batches that later releases no longer serve; they stay in their
    /// shards and out of every collection and dataset.
    #[serde(default)]
    pub rows_withheld: WithheldRows,
    /// Papers deleted from the run (`embedfleet delete`): out of `papers_live`, and out of each
    /// collection once the delete reached it (`uploads_by_collection`'s `deletes_pending`).
    #[serde(default)]
    pub papers_deleted: u64,
    /// The run directory's filesystem: free space against what the rest of the run writes
    /// (absent where it cannot be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<crate::space::DiskStatus>,
}

/// Rows a corpus release withheld from their batches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WithheldRows {
    /// A newer row of the same paper serves it (its text changed).
    pub superseded: u64,
    /// The paper left the corpus.
    pub withdrawn: u64,
}

impl WithheldRows {
    /// Each changed paper supersedes one row, each withdrawn paper withholds one: counted from
    /// the releases (one row each), never from the papers (millions of rows, at every poll).
    pub fn of(releases: &[ReleaseStatus]) -> Self {
        releases
            .iter()
            .filter(|r| r.planned)
            .fold(Self::default(), |acc, r| Self {
                superseded: acc.superseded + r.counts.changed,
                withdrawn: acc.withdrawn + r.counts.withdrawn,
            })
    }

    pub fn total(&self) -> u64 {
        self.superseded + self.withdrawn
    }
}

/// One corpus release in `status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReleaseStatus {
    pub release: i64,
    /// The command line that planned it.
    #[serde(default)]
    pub command: Option<String>,
    /// `false` while it is being planned (its counts are then zero).
    pub planned: bool,
    #[serde(flatten)]
    pub counts: super::ReleaseCounts,
    /// Its batches (those of its corpus files), and how many are embedded.
    pub batches: u64,
    pub batches_done: u64,
    /// Papers its finished embed runs embedded, and their node-hours (each job one node).
    pub papers_embedded: u64,
    pub embed_node_hours: f64,
}

/// Upload progress into one collection.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectionUpload {
    /// Rows acknowledged (durable in the collection).
    pub acked: u64,
    /// Rows of batches that failed after every retry; `embedfleet upload` again sends them.
    pub failed: u64,
    /// Rows of the run's shards not acknowledged yet (failed ones included).
    pub missing: u64,
    /// The newest corpus release the collection was brought up to (every row sent, every
    /// withdrawal and delete applied); `None` when no upload has completed since run.db
    /// recorded it. Below the run's newest release, that release's changes are not in it yet.
    #[serde(default)]
    pub release: Option<i64>,
    /// The papers the collection holds, where run.db knows: the live papers of its release
    /// less the deletes that reached it (`None` until an upload into it completed).
    #[serde(default)]
    pub holds: Option<u64>,
    /// Papers deleted from the run (`embedfleet delete`) whose delete has not reached this
    /// collection yet: still searchable there until `embedfleet upload` (or a `delete` to it).
    #[serde(default)]
    pub deletes_pending: u64,
}

/// The live papers of release `release` (deletes aside): every paper its releases added, less
/// those they withdrew (a changed paper supersedes its own row: one paper either way). A run
/// with no release recorded has its planned papers.
fn live_at(releases: &[ReleaseStatus], release: i64, papers_planned: u64) -> u64 {
    let upto: Vec<&ReleaseStatus> = releases
        .iter()
        .filter(|r| r.planned && r.release <= release)
        .collect();
    if upto.is_empty() {
        return papers_planned;
    }
    upto.iter()
        .map(|r| r.counts.added)
        .sum::<u64>()
        .saturating_sub(upto.iter().map(|r| r.counts.withdrawn).sum())
}

impl RunDb {
    /// The run's state, its aggregates read from the counts run.db keeps
    /// ([`super::counts`]; recounted from the tables with `EMBEDFLEET_STATUS_RECOUNT=1`).
    pub fn status(&self) -> Result<RunStatus> {
        let counts = self.counts()?;
        self.status_from(counts)
    }

    /// [`RunDb::status`] with every aggregate recounted from the tables, as embedfleet did
    /// before run.db kept counts: what the counts are checked against.
    pub fn status_recounted(&self) -> Result<RunStatus> {
        let counts = self.counts_recounted()?;
        self.status_from(counts)
    }

    fn status_from(&self, counts: Counts) -> Result<RunStatus> {
        let c = &self.conn;
        let e = |e| self.err(e);
        let scalar = |sql: &str| -> Result<u64> {
            c.prepare_cached(sql)
                .and_then(|mut stmt| stmt.query_row([], |r| r.get::<_, Option<u64>>(0)))
                .map(|v| v.unwrap_or(0))
                .map_err(e)
        };
        let corrupt_files: BTreeMap<String, String> = {
            let mut stmt = c
                .prepare_cached("SELECT path, corrupt FROM corpus_files WHERE corrupt IS NOT NULL")
                .map_err(e)?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)));
            rows.and_then(|r| r.collect()).map_err(e)?
        };
        let (rows_in_shards, papers_planned) = (counts.rows_in_shards, counts.papers_planned);
        let papers_per_second = counts.papers_per_second;
        let eta_seconds = papers_per_second
            .map(|rate| papers_planned.saturating_sub(rows_in_shards) as f64 / rate);
        // One row per collection the run uploaded into: a few, whatever the run's size.
        let released: BTreeMap<String, i64> = {
            let mut stmt = c
                .prepare_cached("SELECT collection, release FROM upload_releases")
                .map_err(e)?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)));
            rows.and_then(|r| r.collect()).map_err(e)?
        };
        let releases = self.release_status(&counts.by_release)?;
        let rows_withheld = WithheldRows::of(&releases);
        // Tombstones are few (papers deleted by hand): counted per collection by rowid range.
        let papers_deleted = scalar("SELECT count(*) FROM tombstones")?;
        let mut uploads_by_collection = BTreeMap::new();
        for (collection, &(acked, failed)) in &counts.uploads {
            let release = released.get(collection).copied();
            let applied: u64 = c
                .prepare_cached(
                    "SELECT count(*) FROM tombstones WHERE rowid <=
                         coalesce((SELECT through FROM deletes_applied WHERE collection = ?1), 0)",
                )
                .and_then(|mut stmt| stmt.query_row([collection], |r| r.get(0)))
                .map_err(e)?;
            let upload = CollectionUpload {
                acked,
                failed,
                missing: rows_in_shards.saturating_sub(acked),
                release,
                holds: release
                    .map(|r| live_at(&releases, r, papers_planned).saturating_sub(applied)),
                deletes_pending: papers_deleted.saturating_sub(applied),
            };
            uploads_by_collection.insert(collection.clone(), upload);
        }
        Ok(RunStatus {
            format_version: STATUS_FORMAT_VERSION,
            run_dir: self.dir.display().to_string(),
            schema_version: self.schema_version()?,
            plan_complete: self.is_planned()?,
            corpus_files: scalar("SELECT count(*) FROM corpus_files")?,
            corpus_files_planned: scalar(
                "SELECT count(*) FROM corpus_files WHERE state = 'planned'",
            )?,
            corrupt_files,
            papers_planned,
            chars_planned: counts.chars_planned,
            papers_filtered: scalar("SELECT sum(filtered) FROM corpus_files")?,
            papers_quarantined: counts.papers_quarantined,
            quarantined_by_reason: counts.quarantined_by_reason,
            batches: counts.batches,
            batches_by_state: counts.batches_by_state,
            jobs_by_queue: counts.jobs_by_queue,
            shards: counts.shards,
            rows_in_shards,
            points_uploaded: counts.uploads.values().map(|u| u.0).sum(),
            points_failed: counts.uploads.values().map(|u| u.1).sum(),
            queue_caps: self.queue_caps()?,
            paused: self.paused()?,
            pause_reason: self.pause_reason()?,
            papers_per_second,
            eta_seconds,
            tokens_embedded: counts.tokens_embedded,
            uploads_by_collection,
            attempts_by_state: counts.attempts_by_state,
            live: self.live_attempts()?,
            releases,
            papers_live: papers_planned
                .saturating_sub(rows_withheld.total())
                .saturating_sub(papers_deleted),
            rows_withheld,
            papers_deleted,
            disk: self.disk_status(papers_planned.saturating_sub(rows_in_shards)),
        })
    }

    /// Free space at the run directory, and what the shards of `remaining` papers take at the
    /// bytes per row of the newest shard, else the run's pinned width (one row read, one file
    /// looked at: the same cost at any size of run).
    fn disk_status(&self, remaining: u64) -> Option<crate::space::DiskStatus> {
        let space = crate::space::space_of(&self.dir).ok()?;
        let newest: Option<(String, i64)> = self
            .conn
            .prepare_cached("SELECT path, rows FROM shards ORDER BY id DESC LIMIT 1")
            .and_then(|mut stmt| stmt.query_row([], |r| Ok((r.get(0)?, r.get(1)?))))
            .ok();
        let per_row = newest
            .filter(|(_, rows)| *rows > 0)
            .and_then(|(path, rows)| {
                let bytes = std::fs::metadata(self.dir.join(path)).ok()?.len();
                Some(bytes.div_ceil(rows as u64))
            })
            .or_else(|| {
                let settings = crate::handoff::OutputSettings::read(&self.layout()).ok()??;
                let value = match settings.vector_dtype {
                    crate::shardfile::VectorDtype::F32 => 4,
                    crate::shardfile::VectorDtype::F16 => 2,
                };
                Some(crate::space::shard_bytes(1, settings.dim? as u64, value))
            });
        Some(crate::space::DiskStatus {
            dir: self.dir.display().to_string(),
            free_bytes: space.free,
            total_bytes: space.total,
            needed_bytes: per_row.map(|b| b.saturating_mul(remaining)),
        })
    }

    /// Each release with its batches and what embedding them cost.
    fn release_status(&self, work: &BTreeMap<i64, ReleaseWork>) -> Result<Vec<ReleaseStatus>> {
        Ok(self
            .releases()?
            .into_iter()
            .map(|r| {
                let w = work.get(&r.id).copied().unwrap_or_default();
                ReleaseStatus {
                    release: r.id,
                    command: r.command,
                    planned: r.planned_at.is_some(),
                    counts: r.counts.unwrap_or_default(),
                    batches: w.batches,
                    batches_done: w.batches_done,
                    papers_embedded: w.papers_embedded,
                    embed_node_hours: w.embed_seconds / 3600.0,
                }
            })
            .collect())
    }
}
