//! Step 4 of a load: each group's snapshot recovered on the peer holding its key's shard,
//! `in_flight` at once, each recorded in run.db as it ends; then the rows the built shards hold
//! that their groups no longer serve deleted by id in their key.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use embedfleet_core::rundb::{RunDb, SnapshotLoadRow, SnapshotStep};
use embedfleet_core::RunLayout;
use embedfleet_vectordb::{point_id, DeleteRequest, KeyedShard, QdrantServer, Sink};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::groups::Group;
use crate::build::describe_batches;
use crate::rest::{Peer, RestClient};
use crate::SnapshotError;

/// Test hook: milliseconds each recovery waits before it starts, so that a test can kill a
/// load mid-way. Not for production use.
pub const SNAPSHOT_TEST_DELAY_ENV: &str = "EMBEDFLEET_SNAPSHOT_TEST_DELAY_MS";

/// Ids deleted in one request.
const DELETE_CHUNK: usize = 1024;

/// What the recoveries came to.
pub(super) struct Recovered {
    /// Groups recovered now.
    pub recovered: usize,
    /// Groups a previous load had recovered (their rows say so, for this key and snapshot).
    pub already: usize,
    pub seconds: f64,
}

/// Where the load is: the collection's rows in run.db (`recorded`, by a group's first batch,
/// under the upload progress key `progress`) and the cluster.
pub(super) struct Place<'a> {
    pub db: &'a RunDb,
    pub progress: &'a str,
    pub rest: &'a RestClient,
    pub peers: &'a [Peer],
    pub name: &'a str,
    pub layout: &'a RunLayout,
}

/// Recovers the groups not recovered yet, recording each in `recorded` and run.db (see the
/// module docs).
pub(super) fn recover_groups(
    at: &Place<'_>,
    groups: &[Group],
    placed: &[KeyedShard],
    recorded: &mut HashMap<i64, SnapshotLoadRow>,
    in_flight: usize,
    show_progress: bool,
) -> Result<Recovered, SnapshotError> {
    let mut todo = Vec::new();
    let mut already = 0;
    for g in groups {
        let Some(shard) = placed.iter().find(|s| s.key == g.key) else {
            return Err(SnapshotError::Check {
                what: format!("shard key {}", g.key),
                message: "the server lists no shard for it".into(),
            });
        };
        let row_id = g.batches.0;
        let done = recorded.get(&row_id).is_some_and(|r| {
            r.step >= SnapshotStep::Recovered
                && r.shard_key == g.key
                && r.shard_id == Some(shard.shard_id)
                && r.snapshot_sha256.as_deref() == Some(g.manifest.snapshot_sha256.as_str())
        });
        if done {
            already += 1;
            continue;
        }
        let row = SnapshotLoadRow {
            batch_id: row_id,
            shard_key: g.key.clone(),
            shard_id: Some(shard.shard_id),
            snapshot_sha256: None,
            points: None,
            step: SnapshotStep::Key,
        };
        at.db.record_snapshot_load(at.progress, &row)?;
        recorded.insert(row_id, row);
        // One replica gets the snapshot: the server marks the key's other replicas dead, and
        // they copy the recovered one (a shard transfer); step 5 waits for them.
        let url = peer_url(at.peers, shard.peers.first().copied(), at.rest);
        todo.push((g, shard.shard_id, url));
    }
    let started = Instant::now();
    let bar = progress_bar(show_progress, todo.len() as u64);
    let recovered = recover_all(at.rest, at.name, at.layout, &todo, in_flight, |g, r| {
        if r.is_ok() {
            let row = SnapshotLoadRow {
                snapshot_sha256: Some(g.manifest.snapshot_sha256.clone()),
                points: Some(g.manifest.points),
                step: SnapshotStep::Recovered,
                ..recorded[&g.batches.0].clone()
            };
            at.db.record_snapshot_load(at.progress, &row)?;
            bar.inc(1);
        }
        Ok(())
    })?;
    bar.finish_and_clear();
    Ok(Recovered {
        recovered,
        already,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Deletes by id, in their key, the rows the built shards hold that their groups no longer
/// serve (a delete is idempotent: a load killed here deletes them again). Returns how many.
pub(super) fn delete_extra_rows(
    server: &QdrantServer,
    name: &str,
    groups: &[Group],
) -> Result<u64, SnapshotError> {
    let mut deleted = 0;
    for g in groups.iter().filter(|g| !g.extra.is_empty()) {
        let ids: Vec<_> = g.extra.iter().map(|id| point_id(id)).collect();
        for chunk in ids.chunks(DELETE_CHUNK) {
            server.delete(DeleteRequest::new(name, chunk).shard_key(Some(&g.key)))?;
        }
        deleted += g.manifest.points - g.points;
    }
    Ok(deleted)
}

/// The REST address of peer `peer`, the load's own server where it is not known.
pub(super) fn peer_url(peers: &[Peer], peer: Option<u64>, rest: &RestClient) -> String {
    peer.and_then(|id| peers.iter().find(|p| p.id == id))
        .map_or_else(|| rest.url().to_owned(), |p| p.rest_url.clone())
}

/// Recovers each of `todo` on its peer, `in_flight` at once; `on_done` runs on this thread for
/// each result (run.db stays with this thread). Returns how many were recovered, or the first
/// error once every recovery in flight has ended.
fn recover_all(
    rest: &RestClient,
    collection: &str,
    layout: &RunLayout,
    todo: &[(&Group, u32, String)],
    in_flight: usize,
    mut on_done: impl FnMut(&Group, &Result<(), SnapshotError>) -> Result<(), SnapshotError>,
) -> Result<usize, SnapshotError> {
    let (job_tx, job_rx) = crossbeam_channel::unbounded::<usize>();
    for i in 0..todo.len() {
        let _ = job_tx.send(i);
    }
    drop(job_tx);
    let (done_tx, done_rx) = crossbeam_channel::unbounded();
    let delay = std::env::var(SNAPSHOT_TEST_DELAY_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis);
    std::thread::scope(|scope| {
        for _ in 0..in_flight.min(todo.len()) {
            let (job_rx, done_tx) = (job_rx.clone(), done_tx.clone());
            scope.spawn(move || {
                for i in job_rx {
                    if let Some(delay) = delay {
                        std::thread::sleep(delay);
                    }
                    let (b, shard_id, url) = &todo[i];
                    let path = layout.resolve(&b.manifest.snapshot);
                    let result = rest.for_peer(url).and_then(|peer| {
                        peer.recover_shard(
                            collection,
                            *shard_id,
                            &path,
                            &b.manifest.snapshot_sha256,
                        )
                    });
                    let failed = result.is_err();
                    if done_tx.send((i, result)).is_err() || failed {
                        return;
                    }
                }
            });
        }
        drop(done_tx);
        let mut recovered = 0;
        let mut first_error = None;
        for (i, result) in done_rx {
            let (b, _, _) = &todo[i];
            on_done(b, &result)?;
            match result {
                Ok(()) => recovered += 1,
                Err(e) => {
                    first_error.get_or_insert(SnapshotError::Check {
                        what: format!(
                            "recovering {} (shard key {})",
                            describe_batches(b.batches),
                            b.key
                        ),
                        message: e.to_string(),
                    });
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(recovered),
        }
    })
}

fn progress_bar(show: bool, total: u64) -> ProgressBar {
    if !show {
        return ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "recovering shards {bar:30} {pos}/{len} {elapsed} (eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}
