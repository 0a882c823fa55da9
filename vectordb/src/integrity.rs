//! Whether the progress run.db recorded is still true of the collection, checked before an upload
//! trusts it: the collection's identity, then each batch's points, and the run's tombstones.
//!
//! **Identity.** When the run first uploads into a collection it stores a marker it generated in
//! the collection (the server's collection `metadata`, Qdrant 1.16+; a file in the collection's
//! directory for the embedded engine, which has no metadata; the table's comment in
//! PostgreSQL) and records it in run.db
//! (`upload_collections`). A collection found with another marker or none — dropped and made
//! again, another run's, restored from elsewhere — is not the one the progress is about: the
//! progress is forgotten and every point sent again (same ids). A marker is used rather than a
//! reserved point because a point would be counted, searched and published like a paper. The
//! marker, not the path or URL, is what progress belongs to: a collection the run recorded under
//! another key (the run directory moved or copied, another peer's URL) is recognised by its
//! marker and its progress carried over ([`follow_marker`]).
//!
//! **Per batch.** Each batch's acknowledged rows are counted in the collection by their point
//! ids (a `has_id` filter, in the batch's shard key where the collection is keyed). Points carry
//! no batch in their payload, and adding one now would leave every collection already uploaded
//! (and every built shard) uncountable until rewritten, while ids are deterministic and counting
//! by them needs nothing but the shards' `id` column. A batch holding fewer of its live points
//! than acknowledged is sent again (that batch only, same ids); one still holding a tombstoned
//! paper gets it deleted again (a `delete` killed between run.db and Qdrant).

use std::collections::{BTreeMap, HashSet};

use arrow_array::{Array, RecordBatch, StringArray};

use embedfleet_core::rundb::{RunDb, RunDbError, Tombstone, WithheldRow};

use crate::error::{UploadError, UploadRunError};
use crate::points::point_id;
use crate::prepared::Prepared;
use crate::request::{CountRequest, DeleteRequest};
use crate::shard_keys::ShardKeys;
use crate::shards;
use crate::sink::Sink;

/// What no upload may send: the run's tombstones (papers deleted with `embedfleet delete`, by
/// id, whatever batch holds them) and the rows later corpus releases withheld from their batch
/// (superseded by a newer copy, or withdrawn), with the points each batch must not leave in
/// a collection.
#[derive(Debug, Default, Clone)]
pub struct Tombstones {
    papers: HashSet<String>,
    /// Per batch: rows its shards hold that it no longer serves.
    withheld: BTreeMap<i64, HashSet<String>>,
    /// Per batch: ids whose point must not be in a collection (tombstoned, or withdrawn with no
    /// newer copy).
    by_batch: BTreeMap<i64, Vec<String>>,
    /// Per batch: rows a newer row of the same paper serves, with the newer row's batch.
    superseded: BTreeMap<i64, Vec<(String, i64)>>,
}

impl Tombstones {
    /// The tombstones and withheld rows recorded in run.db.
    pub fn read(db: &RunDb) -> Result<Self, RunDbError> {
        Ok(Self::from(db.tombstones()?).withholding(db.withheld_rows()?))
    }

    /// These, and the `rows` releases withheld.
    pub fn withholding(mut self, rows: Vec<WithheldRow>) -> Self {
        for row in rows {
            match row.live_batch {
                None => self
                    .by_batch
                    .entry(row.batch_id)
                    .or_default()
                    .push(row.paper_id.clone()),
                Some(live) => self
                    .superseded
                    .entry(row.batch_id)
                    .or_default()
                    .push((row.paper_id.clone(), live)),
            }
            self.withheld
                .entry(row.batch_id)
                .or_default()
                .insert(row.paper_id);
        }
        self
    }

    /// True when `batch` serves its row of `paper_id`: neither deleted nor withheld.
    pub fn serves(&self, batch: i64, paper_id: &str) -> bool {
        !self.papers.contains(paper_id)
            && !self
                .withheld
                .get(&batch)
                .is_some_and(|rows| rows.contains(paper_id))
    }

    /// True when nothing is deleted or withheld.
    pub fn is_empty(&self) -> bool {
        self.papers.is_empty() && self.withheld.is_empty()
    }

    /// The rows of `record_batch` (a part of batch `batch`'s shard) that the batch serves, as
    /// slices of it (nothing is copied): the whole of it when it serves all, as almost always.
    pub fn live_slices(&self, batch: i64, record_batch: &RecordBatch) -> Vec<RecordBatch> {
        let ids = record_batch
            .column_by_name("id")
            .and_then(|c| c.as_any().downcast_ref::<StringArray>());
        let nothing_withheld = self.papers.is_empty() && !self.withheld.contains_key(&batch);
        let Some(ids) = ids.filter(|_| !nothing_withheld) else {
            // Nothing to leave out, or no `id` column (refused by the conversion, with its reason).
            return vec![record_batch.clone()];
        };
        let mut slices = Vec::new();
        let mut start = 0;
        for row in 0..record_batch.num_rows() {
            if ids.is_valid(row) && !self.serves(batch, ids.value(row)) {
                if row > start {
                    slices.push(record_batch.slice(start, row - start));
                }
                start = row + 1;
            }
        }
        if record_batch.num_rows() > start {
            slices.push(record_batch.slice(start, record_batch.num_rows() - start));
        }
        slices
    }

    /// The ids of `batch` whose point must not be in a collection.
    pub fn of_batch(&self, batch: i64) -> &[String] {
        self.by_batch.get(&batch).map_or(&[], Vec::as_slice)
    }

    /// The ids of `batch` whose point must not be in the place (shard key, built shard) that
    /// holds `batch`'s points, where `same_place(b)` says whether batch `b`'s points go to that
    /// place too: [`Tombstones::of_batch`], and the rows a newer row serves from another place.
    /// A custom-sharded collection holds an old row's point in its own key apart from the new
    /// row's (the same id): it is deleted there, by key. In one place the two are one point,
    /// the newer row's, and deleting the id would delete it.
    pub fn dead_in_place(&self, batch: i64, same_place: impl Fn(i64) -> bool) -> Vec<String> {
        let mut ids = self.of_batch(batch).to_vec();
        if let Some(rows) = self.superseded.get(&batch) {
            ids.extend(
                rows.iter()
                    .filter(|(_, live)| !same_place(*live))
                    .map(|(id, _)| id.clone()),
            );
        }
        ids
    }

    /// The ids of `batch` whose newer row is in the same place (see
    /// [`Tombstones::dead_in_place`]): there the two rows are one point, the newer row's.
    pub fn replaced_in_place(&self, batch: i64, same_place: impl Fn(i64) -> bool) -> Vec<String> {
        self.superseded.get(&batch).map_or_else(Vec::new, |rows| {
            rows.iter()
                .filter(|(_, live)| same_place(*live))
                .map(|(id, _)| id.clone())
                .collect()
        })
    }
}

impl From<Vec<Tombstone>> for Tombstones {
    fn from(list: Vec<Tombstone>) -> Self {
        let mut out = Self::default();
        for t in list {
            out.papers.insert(t.paper_id.clone());
            out.by_batch.entry(t.batch_id).or_default().push(t.paper_id);
        }
        out
    }
}

/// A new identity marker for a collection this run makes or finds unmarked.
pub fn new_marker() -> String {
    uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .to_string()
}

/// Records in run.db which collection the progress under `key` is about: the marker `found` in
/// it, or a new one stored now, which carries this run's vectors
/// ([`crate::vectors_identity`]). A collection whose marker says other vectors is refused
/// first. A sink that does not keep markers (a database without them, or a Qdrant server older
/// than 1.16, which drops collection metadata) gets nothing recorded: the per-batch counts are
/// the check left.
pub fn record_marker<E>(
    sink: &dyn Sink,
    db: &RunDb,
    key: &str,
    name: &str,
    found: Option<String>,
) -> Result<(), E>
where
    E: From<UploadError> + From<RunDbError>,
{
    let vectors = crate::vectors_identity::of_run(db);
    crate::vectors_identity::check(name, found.as_deref(), vectors.as_deref())?;
    let marker = match found {
        Some(marker) => marker,
        None => {
            let marker = crate::vectors_identity::marker(new_marker(), vectors.as_deref());
            sink.set_collection_marker(name, &marker)?;
            match sink.collection_marker(name)? {
                Some(marker) => marker,
                None => return Ok(()),
            }
        }
    };
    db.record_upload_marker(key, &marker)?;
    Ok(())
}

/// Carries the run's progress over to `key` when the collection `name` found there (its
/// `found` marker) is one the run recorded under another key: the same collection reached by
/// another path or URL (a run directory moved or copied, another peer of a cluster, an
/// address instead of a name). Progress belongs to the collection, not to the words used to
/// reach it; the per-batch counts then check it as ever. Returns whether it moved.
pub fn follow_marker(
    db: &RunDb,
    key: &str,
    name: &str,
    found: Option<&str>,
) -> Result<bool, RunDbError> {
    let Some(marker) = found else {
        return Ok(false);
    };
    if db.upload_marker(key)?.as_deref() == Some(marker) {
        return Ok(false);
    }
    let Some(from) = db.upload_key_with_marker(marker, key)? else {
        return Ok(false);
    };
    eprintln!(
        "note: `{name}` here is the collection this run uploaded into as `{from}` (the same identity marker): its progress carries over"
    );
    db.move_upload_progress(&from, key)?;
    Ok(true)
}

/// True when the progress recorded under `key` is not about the collection found: it is gone,
/// or it carries another marker than the one recorded. With no marker recorded (progress from
/// before markers) the collection is not refused here; the per-batch counts check it.
pub fn is_another_collection(recorded: Option<&str>, exists: bool, found: Option<&str>) -> bool {
    !exists || recorded.is_some_and(|r| found != Some(r))
}

/// What [`check_batches`] found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BatchCheck {
    /// Batches holding fewer of their acknowledged points than recorded: sent again.
    pub resent: Vec<i64>,
    /// Tombstoned points found in the collection and deleted again.
    pub deleted_again: u64,
}

/// Counts each batch's acknowledged points in `collection` and repairs what differs (see the
/// module docs): forgets the progress of a short batch under `key`, deletes tombstoned points
/// found again. `keys`: the run's shard keys where the collection is custom-sharded.
pub fn check_batches(
    sink: &dyn Sink,
    db: &RunDb,
    key: &str,
    collection: &str,
    prepared: &Prepared,
    tombstones: &Tombstones,
    keys: Option<&ShardKeys>,
) -> Result<BatchCheck, UploadRunError> {
    let mut check = BatchCheck::default();
    let mut batches: BTreeMap<i64, Vec<&embedfleet_core::rundb::UploadShard>> = BTreeMap::new();
    for shard in prepared.shards.iter().filter(|s| s.rows_acked > 0) {
        batches.entry(shard.batch_id).or_default().push(shard);
    }
    for (batch, shards_of_batch) in batches {
        let shard_key = keys.map(|k| k.key_of(batch));
        let mut live = Vec::new();
        for shard in shards_of_batch {
            let ids = shards::paper_ids(&db.dir().join(&shard.path), shard.rows_acked)?;
            live.extend(
                ids.iter()
                    .filter(|id| tombstones.serves(batch, id))
                    .map(|id| point_id(id)),
            );
        }
        let holds = sink.count(
            CountRequest::new(collection)
                .ids(&live)
                .shard_key(shard_key.as_deref()),
        )?;
        if holds < live.len() as u64 {
            eprintln!(
                "note: batch {batch} holds {holds} of its {} acknowledged points in `{collection}`: sending that batch again",
                live.len()
            );
            db.forget_batch_uploads(key, batch)?;
            check.resent.push(batch);
        }
        let dead: Vec<uuid::Uuid> = match keys {
            Some(keys) => {
                let here = keys.key_of(batch);
                tombstones.dead_in_place(batch, |b| keys.key_of(b) == here)
            }
            None => tombstones.of_batch(batch).to_vec(),
        }
        .iter()
        .map(|id| point_id(id))
        .collect();
        let back = sink.count(
            CountRequest::new(collection)
                .ids(&dead)
                .shard_key(shard_key.as_deref()),
        )?;
        if back > 0 {
            eprintln!(
                "note: batch {batch} holds {back} deleted or withdrawn papers in `{collection}`: deleting them (run.db's tombstones and releases)"
            );
            sink.delete(DeleteRequest::new(collection, &dead).shard_key(shard_key.as_deref()))?;
            check.deleted_again += back;
        }
    }
    Ok(check)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn withheld(batch_id: i64, paper_id: &str, live_batch: Option<i64>) -> WithheldRow {
        WithheldRow {
            batch_id,
            paper_id: paper_id.into(),
            gone: live_batch.is_none(),
            live_batch,
        }
    }

    #[test]
    fn a_superseded_row_is_dead_only_where_its_newer_row_is_not() {
        let t = Tombstones::from(vec![Tombstone {
            batch_id: 1,
            paper_id: "D".into(),
        }])
        .withholding(vec![
            withheld(1, "W", None),    // withdrawn
            withheld(1, "C", Some(9)), // changed, its new row in batch 9
            withheld(1, "N", Some(2)), // changed, its new row in batch 2
        ]);
        // No batch serves any of them from batch 1.
        for id in ["D", "W", "C", "N"] {
            assert!(!t.serves(1, id), "{id}");
        }
        assert!(t.serves(9, "C") && t.serves(2, "N"));
        // One place for every batch (hash sharding, the embedded engine): deleting a changed
        // paper's id would delete its new point.
        assert_eq!(t.of_batch(1), ["D", "W"]);
        assert_eq!(t.dead_in_place(1, |_| true), ["D", "W"]);
        // Batches 1-4 in one key, 5-8 in the next...: C's old point is alone in batch 1's key.
        let key = |b: i64| (b - 1) / 4;
        assert_eq!(t.dead_in_place(1, |b| key(b) == key(1)), ["D", "W", "C"]);
        assert_eq!(t.dead_in_place(1, |b| b == 1), ["D", "W", "C", "N"]);
        assert!(t.dead_in_place(9, |_| false).is_empty());
        assert_eq!(t.replaced_in_place(1, |b| key(b) == key(1)), ["N"]);
        assert!(t.replaced_in_place(1, |b| b == 1).is_empty());
    }

    #[test]
    fn progress_is_about_another_collection_when_gone_or_marked_otherwise() {
        assert!(is_another_collection(Some("a"), false, None), "gone");
        assert!(is_another_collection(None, false, None), "gone");
        assert!(
            is_another_collection(Some("a"), true, Some("b")),
            "replaced"
        );
        assert!(is_another_collection(Some("a"), true, None), "unmarked");
        assert!(!is_another_collection(Some("a"), true, Some("a")));
        assert!(
            !is_another_collection(None, true, Some("b")),
            "no marker recorded: the counts decide"
        );
    }
}
