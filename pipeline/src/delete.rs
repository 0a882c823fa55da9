//! `delete`: papers out of a collection by id, tombstone first. Each paper of the run is first
//! recorded as deleted in run.db (a tombstone: no later upload, built shard or publish brings it
//! back), then deleted from the collection, with every earlier tombstone again: a delete killed
//! between the two is finished by the next. In a collection loaded as grouped shards each paper
//! goes from its batch's group's shard key.

use std::collections::BTreeMap;
use std::path::Path;

use embedfleet_core::rundb::{RunDb, Tombstone};
use embedfleet_core::RunLayout;
use embedfleet_vectordb::shard_keys::ShardKeys;
use embedfleet_vectordb::{self as upload, CountRequest, DeleteRequest, Sink};

use crate::error::{io, PipelineError, Result};

/// What a delete did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteReport {
    /// Papers tombstoned by this delete (the others were already).
    pub newly_tombstoned: usize,
    /// Every tombstone of the run now.
    pub tombstones: usize,
    /// Ids of no batch of this run: deleted from the collection only.
    pub unknown: Vec<String>,
    /// Points before and after, when the collection exists.
    pub counts: Option<(u64, u64)>,
}

/// Deletes `papers` from `collection` in `sink`, tombstones first.
pub fn delete_papers(
    db: &RunDb,
    sink: &dyn Sink,
    run_dir: &Path,
    collection: &str,
    papers: &[String],
) -> Result<DeleteReport> {
    let keyed = upload::is_keyed(sink, collection)?;
    let layout = RunLayout::new(run_dir);
    let keys = ShardKeys::for_writes(&layout)
        .map_err(io("read the run's shard keys", &layout.shard_keys_file()))?;
    if papers.len() > 8 {
        db.index_paper_ids()?;
    }
    let mut tombstones = Vec::new();
    let mut unknown = Vec::new();
    for paper in papers {
        match db.batch_of_paper(paper)? {
            Some(batch_id) => tombstones.push(Tombstone {
                batch_id,
                paper_id: paper.clone(),
            }),
            None => unknown.push(paper.clone()),
        }
    }
    if keyed && !unknown.is_empty() {
        return Err(PipelineError::UnknownPapersInKeyed { papers: unknown });
    }
    let newly_tombstoned = db.record_tombstones(&tombstones)?;
    let all = db.tombstones()?;
    let mut report = DeleteReport {
        newly_tombstoned,
        tombstones: all.len(),
        unknown,
        counts: None,
    };
    if sink.collection_info(collection)?.is_none() {
        return Ok(report);
    }
    let mut by_key: BTreeMap<Option<String>, Vec<upload::Uuid>> = BTreeMap::new();
    for t in &all {
        let key = keyed.then(|| keys.key_of(t.batch_id));
        by_key
            .entry(key)
            .or_default()
            .push(upload::point_id(&t.paper_id));
    }
    // Papers of no batch of this run have no tombstone; they go from the collection only.
    for paper in &report.unknown {
        by_key
            .entry(None)
            .or_default()
            .push(upload::point_id(paper));
    }
    let before = sink.count(CountRequest::new(collection))?;
    for (key, ids) in &by_key {
        sink.delete(DeleteRequest::new(collection, ids).shard_key(key.as_deref()))?;
    }
    let after = sink.count(CountRequest::new(collection))?;
    // Every tombstone so far reached this collection: `status` says which others still hold one.
    db.record_deletes_applied(&upload::progress_key(sink, collection))?;
    report.counts = Some((before, after));
    Ok(report)
}
