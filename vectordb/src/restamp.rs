//! Corpus metadata a release changed without changing the text (`plan --update`): the paper is
//! not embedded again, but its point's payload must follow the release.
//!
//! Only `source` and `year` (of `created`) are in a point's payload, so only a restamp that
//! changed one of them (`Restamp::payload_changed`, told at plan time) is sent; a release that
//! stamps every paper with a new `version` or `added` (as peS2o's do) sends nothing here.
//! Setting a payload is idempotent, so each upload sets them all again after sending (a few,
//! in requests of [`IDS_PER_REQUEST`] points that share the same values): a point sent again
//! from its shard (a new collection, a batch re-sent after a check, a group built again)
//! carries its shard's older values until then, and nothing needs recording.

use std::collections::BTreeMap;

use embedfleet_core::rundb::{Restamp, RunDb, RunDbError};

use crate::error::{UploadError, UploadRunError};
use crate::points::{parse_year, point_id};
use crate::request::PayloadRequest;
use crate::sink::Sink;

/// Points per set-payload request.
pub const IDS_PER_REQUEST: usize = 1000;

/// The restamps whose payload part changed, of the batches `served` says the collection holds.
pub fn payload_restamps(
    db: &RunDb,
    served: impl Fn(i64) -> bool,
) -> Result<Vec<Restamp>, RunDbError> {
    if !db.has_payload_restamps()? {
        return Ok(Vec::new());
    }
    Ok(db
        .payload_restamps()?
        .into_iter()
        .filter(|r| served(r.batch_id))
        .collect())
}

/// Sets `restamps`' payload in `collection`, each in its batch's shard key (`key_of`, for a
/// custom-sharded collection). Returns the points set.
pub fn apply(
    sink: &dyn Sink,
    collection: &str,
    restamps: &[Restamp],
    key_of: impl Fn(i64) -> Option<String>,
) -> Result<u64, UploadError> {
    // Points that get the same values in the same key go in one request.
    type Values = (Option<String>, Option<i64>, Option<String>);
    let mut by_values: BTreeMap<Values, Vec<uuid::Uuid>> = BTreeMap::new();
    for r in restamps {
        let year = r.metadata.created.as_deref().and_then(parse_year);
        by_values
            .entry((key_of(r.batch_id), year, r.metadata.source.clone()))
            .or_default()
            .push(point_id(&r.paper_id));
    }
    let mut set = 0;
    for ((key, year, source), ids) in &by_values {
        for chunk in ids.chunks(IDS_PER_REQUEST) {
            sink.set_payload(
                PayloadRequest::new(collection, chunk, *year, source.as_deref())
                    .shard_key(key.as_deref()),
            )?;
            set += chunk.len() as u64;
        }
    }
    if set > 0 {
        eprintln!(
            "upload: {set} points of `{collection}` given the source or year a later corpus release gave their paper"
        );
    }
    Ok(set)
}

/// After an upload's sending: sets the payload restamps of the batches whose every shard is
/// acknowledged in `collection` under the progress `key`. Returns the points set.
pub fn after_upload(
    sink: &dyn Sink,
    db: &RunDb,
    collection: &str,
    key: &str,
) -> Result<u64, UploadRunError> {
    if !db.has_payload_restamps()? {
        return Ok(0);
    }
    let mut complete: BTreeMap<i64, bool> = BTreeMap::new();
    for shard in crate::prepared::prepare(db, key)?.shards {
        *complete.entry(shard.batch_id).or_insert(true) &= shard.is_done();
    }
    let restamps = payload_restamps(db, |b| complete.get(&b) == Some(&true))?;
    if restamps.is_empty() {
        return Ok(0);
    }
    let keys = crate::open::shard_keys_of(sink, db, collection)?;
    Ok(apply(sink, collection, &restamps, |b| {
        keys.as_ref().map(|k| k.key_of(b))
    })?)
}
