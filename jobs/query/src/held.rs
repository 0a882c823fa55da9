//! Which rows of the run's parquet shards a collection holds: the truth `eval` measures recall
//! against is the exact top-k over those rows only, not over every row ever embedded.
//!
//! A collection holds the live papers of the release its last complete upload brought it to
//! (run.db's `upload_releases`; the run's newest release when none is recorded), less the papers
//! whose delete reached it (tombstones up to its `deletes_applied` mark): a row a release
//! superseded or withdrew, or a deleted paper, is no answer of the collection, and counting it
//! as one made the exact row's recall 0.95 on an updated run. A paper deleted from another
//! database only is still an answer here, until an upload or a delete reaches this one
//! (`status` says so). The state is also what the cached truth is tied to
//! ([`HeldRows::digest`]): a delete or an upload since makes the cache a miss.

use std::collections::{HashMap, HashSet};

use embedfleet_core::rundb::{RunDb, RunDbError};
use embedfleet_vectordb::{progress_key, Sink};

/// The rows a collection holds, as the rows it does not (few: what releases and deletes changed).
#[derive(Debug, Clone, Default)]
pub struct HeldRows {
    /// The release the collection holds (`None`: nothing recorded, the run's newest assumed).
    pub release: Option<i64>,
    /// Per batch: the ids its shards hold that the collection does not serve from it.
    withheld: HashMap<i64, HashSet<String>>,
    /// Papers whose delete reached the collection, whatever batch holds them.
    deleted: HashSet<String>,
    /// Batches of releases after the collection's.
    later: HashSet<i64>,
    digest: u64,
}

impl HeldRows {
    /// What `collection` at `sink` holds of the run of `db`.
    pub fn of(db: &RunDb, sink: &dyn Sink, collection: &str) -> Result<Self, RunDbError> {
        let newest = db.newest_planned_release()?.unwrap_or(1);
        let key = progress_key(sink, collection);
        let release = db.upload_release(&key)?;
        let at = release.unwrap_or(newest).min(newest);
        let mut held = Self {
            release,
            ..Self::default()
        };
        for (batch, id) in db.rows_withheld_by(at)? {
            held.withheld.entry(batch).or_default().insert(id);
        }
        held.deleted = db
            .tombstones_applied_to(&key)?
            .into_iter()
            .map(|t| t.paper_id)
            .collect();
        if at < newest {
            held.later = db.batches_after_release(at)?.into_iter().collect();
        }
        held.digest = held.digest_of(at);
        Ok(held)
    }

    /// True when the collection holds nothing of `batch`'s shards.
    pub fn skips_batch(&self, batch: i64) -> bool {
        self.later.contains(&batch)
    }

    /// True when every row of `batch` is held (then no id need be looked at).
    pub fn holds_all_of(&self, batch: i64) -> bool {
        self.deleted.is_empty() && !self.withheld.contains_key(&batch) && !self.skips_batch(batch)
    }

    /// True when the collection serves `batch`'s row of `paper_id`.
    pub fn holds(&self, batch: i64, paper_id: &str) -> bool {
        !self.skips_batch(batch)
            && !self.deleted.contains(paper_id)
            && !self
                .withheld
                .get(&batch)
                .is_some_and(|ids| ids.contains(paper_id))
    }

    /// A digest of the state (the release and every row left out): what a cached truth is tied to.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    fn digest_of(&self, at: i64) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&at.to_le_bytes());
        let mut rows: Vec<(i64, &str)> = self
            .withheld
            .iter()
            .flat_map(|(b, ids)| ids.iter().map(move |id| (*b, id.as_str())))
            .collect();
        rows.sort_unstable();
        for (batch, id) in rows {
            h.update(&batch.to_le_bytes());
            h.update(id.as_bytes());
            h.update(b"\0");
        }
        let mut deleted: Vec<&String> = self.deleted.iter().collect();
        deleted.sort_unstable();
        for id in deleted {
            h.update(b"d");
            h.update(id.as_bytes());
            h.update(b"\0");
        }
        let mut later: Vec<&i64> = self.later.iter().collect();
        later.sort_unstable();
        for b in later {
            h.update(&b.to_le_bytes());
        }
        h.digest()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_withheld_deleted_or_of_later_releases_are_not_held() {
        let mut held = HeldRows::default();
        held.withheld.entry(1).or_default().insert("W".into());
        held.deleted.insert("D".into());
        held.later.insert(3);
        assert!(held.holds(1, "A") && held.holds(2, "W"));
        assert!(!held.holds(1, "W"), "withheld from batch 1 only");
        assert!(!held.holds(2, "D"), "deleted from every batch");
        assert!(!held.holds(3, "A") && held.skips_batch(3));
        assert!(!held.holds_all_of(2), "a deleted paper may be anywhere");
        held.deleted.clear();
        assert!(held.holds_all_of(2) && !held.holds_all_of(1));
        let before = held.digest_of(2);
        held.deleted.insert("D".into());
        assert_ne!(held.digest_of(2), before, "a delete changes the state");
        assert_ne!(held.digest_of(1), held.digest_of(2), "so does the release");
    }
}
