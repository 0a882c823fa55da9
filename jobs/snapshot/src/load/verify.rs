//! Step 5 of a load: the collection green and every replica settled, every key's count equal
//! to its built shard's (less the rows deleted after), the collection's total where it holds
//! only this run's keys, and a sample of exact searches finding their own points.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use embedfleet_core::rundb::{RunDb, SnapshotLoadRow, SnapshotStep};
use embedfleet_core::RunLayout;
use embedfleet_vectordb::integrity::Tombstones;
use embedfleet_vectordb::{
    point_id, shards, CountRequest, KeyedShard, PointsBatch, QdrantServer, QueryRequest,
    SearchOptions, Sink,
};

use super::groups::Group;
use super::options::{LoadOptions, LoadReport};
use super::recover::{peer_url, Place};
use crate::build::describe_batches;
use crate::rest::{Peer, RestClient};
use crate::SnapshotError;

/// What a load placed and recorded, for its checks.
pub(super) struct Loaded<'a> {
    pub groups: &'a [Group],
    pub placed: &'a [KeyedShard],
    pub recorded: &'a HashMap<i64, SnapshotLoadRow>,
    pub tombstones: &'a Tombstones,
}

/// Step 5: waits for green and for every replica, then checks the counts and a sample of
/// searches, filling the report's `green_s`, `points`, `collection_points` and
/// `searches_checked`.
pub(super) fn verify_load(
    server: &QdrantServer,
    at: &Place<'_>,
    loaded: &Loaded<'_>,
    options: &LoadOptions,
    report: &mut LoadReport,
) -> Result<(), SnapshotError> {
    let green_start = Instant::now();
    wait_green(server, at.name, options.green_timeout)?;
    report.green_s = green_start.elapsed().as_secs_f64();
    wait_replicas(
        server,
        at.rest,
        at.peers,
        at.name,
        loaded.groups,
        loaded.placed,
        options.green_timeout,
    )?;
    (report.points, report.collection_points) = check_counts(
        server,
        at.db,
        at.progress,
        at.name,
        loaded.groups,
        loaded.recorded,
    )?;
    report.searches_checked = check_searches(
        server,
        at.name,
        at.layout,
        loaded.groups,
        loaded.tombstones,
        options.sample_searches,
    )?;
    Ok(())
}

/// Checks every key's count against its group's points, and the collection's total when it
/// holds only these keys; returns the keys' total and the collection's. A key that counts
/// otherwise gets its run.db row (under `progress`) set back, so the next load recovers it
/// again instead of trusting the record.
fn check_counts(
    server: &QdrantServer,
    db: &RunDb,
    progress: &str,
    name: &str,
    groups: &[Group],
    recorded: &HashMap<i64, SnapshotLoadRow>,
) -> Result<(u64, u64), SnapshotError> {
    let mut total = 0;
    for g in groups {
        let n = server.count(CountRequest::new(name).shard_key(Some(&g.key)))?;
        if n != g.points {
            // Whatever changed the shard (a replaced collection, a write past embedfleet), the
            // next load recovers this group again instead of trusting the record.
            let row = SnapshotLoadRow {
                snapshot_sha256: None,
                points: None,
                step: SnapshotStep::Key,
                ..recorded[&g.batches.0].clone()
            };
            db.record_snapshot_load(progress, &row)?;
            return Err(SnapshotError::Check {
                what: format!("shard key {} ({})", g.key, describe_batches(g.batches)),
                message: format!(
                    "it holds {n} points, its built shard {} less {} it no longer serves; run the load again (it recovers the group again)",
                    g.manifest.points,
                    g.manifest.points - g.points
                ),
            });
        }
        total += n;
    }
    let holds = server.count(CountRequest::new(name))?;
    let only_ours = server
        .keyed_shards(name)?
        .iter()
        .all(|s| groups.iter().any(|g| g.key == s.key));
    if only_ours && holds != total {
        return Err(SnapshotError::Check {
            what: format!("collection `{name}`"),
            message: format!("it holds {holds} points, its shard keys {total}"),
        });
    }
    Ok((total, holds))
}

/// Waits until every replica of every replicated key holds its built shard's points and
/// serves reads. A recovery marks the key's other replicas dead and they copy the recovered
/// one, but the mark is proposed, not awaited: right after the recovery a stale replica may
/// still answer, and a peer whose replica is still copying forwards reads to the recovered one
/// (which alone would then hold the group: a peer lost then loses it). So the end is both:
/// every replica active with no transfer under way, and an exact count through every
/// replica's peer equal to the manifest's.
fn wait_replicas(
    server: &QdrantServer,
    rest: &RestClient,
    peers: &[Peer],
    name: &str,
    groups: &[Group],
    placed: &[KeyedShard],
    timeout: Duration,
) -> Result<(), SnapshotError> {
    let start = Instant::now();
    for g in groups {
        let Some(shard) = placed.iter().find(|s| s.key == g.key) else {
            continue;
        };
        if shard.peers.len() < 2 {
            continue;
        }
        for &peer in &shard.peers {
            let client = rest.for_peer(&peer_url(peers, Some(peer), rest))?;
            loop {
                let n = client.count_in_key(name, &g.key)?;
                if n == g.points {
                    break;
                }
                if start.elapsed() > timeout {
                    return Err(SnapshotError::Check {
                        what: format!("shard key {} on peer {peer}", g.key),
                        message: format!(
                            "its replica holds {n} points, not {}, after {} s",
                            g.points,
                            start.elapsed().as_secs()
                        ),
                    });
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        }
    }
    // Counts first: a stale replica still marked active counts short until its mark lands;
    // then every replica active, so that no group lives on one peer alone.
    let replicated = |key: &str| placed.iter().any(|s| s.key == key && s.peers.len() > 1);
    loop {
        let now = server.keyed_shards(name)?;
        let unsettled: Vec<&str> = now
            .iter()
            .filter(|s| !s.settled && groups.iter().any(|g| g.key == s.key) && replicated(&s.key))
            .map(|s| s.key.as_str())
            .collect();
        if unsettled.is_empty() {
            break;
        }
        if start.elapsed() > timeout {
            return Err(SnapshotError::Check {
                what: format!("shard keys {}", unsettled.join(", ")),
                message: format!(
                    "their replicas are not all active after {} s",
                    start.elapsed().as_secs()
                ),
            });
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(())
}

fn wait_green(server: &QdrantServer, name: &str, timeout: Duration) -> Result<(), SnapshotError> {
    let start = Instant::now();
    // Optimizers may start a moment after the last recovery: look twice before believing green.
    let mut green_seen = 0;
    loop {
        let info = server
            .collection_info(name)?
            .ok_or_else(|| SnapshotError::Check {
                what: format!("collection `{name}`"),
                message: "it is gone".into(),
            })?;
        if info.red {
            return Err(SnapshotError::Check {
                what: format!("collection `{name}`"),
                message: "it is red: an optimization failed; the server's log says why".into(),
            });
        }
        green_seen = if info.green { green_seen + 1 } else { 0 };
        if green_seen >= 2 {
            return Ok(());
        }
        if start.elapsed() > timeout {
            return Err(SnapshotError::Check {
                what: format!("collection `{name}`"),
                message: format!("it is not green after {} s", start.elapsed().as_secs()),
            });
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Exact searches for rows of the parquet shards (spread over the batches): each must find its
/// own point first. Returns how many were checked.
fn check_searches(
    server: &QdrantServer,
    name: &str,
    layout: &RunLayout,
    groups: &[Group],
    tombstones: &Tombstones,
    samples: usize,
) -> Result<usize, SnapshotError> {
    if samples == 0 {
        return Ok(0);
    }
    let per_batch = samples.div_ceil(groups.len()).max(1);
    let mut checked = 0;
    for b in groups {
        let source = &b.manifest.sources[0];
        let path = layout.resolve(&source.file);
        let Some(record_batch) = shards::read_from(&path, 0, per_batch)?.next() else {
            continue;
        };
        let record_batch = record_batch.map_err(|e| shards::ShardReadError {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let points = PointsBatch::from_record_batch(&record_batch)?;
        // A deleted paper is not in the shard: it is not searched for.
        let live = points
            .iter()
            .filter(|p| tombstones.serves(b.batches.0, p.paper_id));
        for p in live.take(samples - checked) {
            let options = SearchOptions {
                exact: true,
                ..SearchOptions::new(1)
            };
            let hits = server
                .query(QueryRequest::one(name, p.vector, options))?
                .into_iter()
                .next()
                .unwrap_or_default();
            let want = point_id(p.paper_id);
            // Another point with the same vector (a duplicate text) may tie: its score is 1 too.
            let ok = hits
                .first()
                .is_some_and(|h| h.id == want || (h.score - 1.0).abs() < 1e-4);
            if !ok {
                return Err(SnapshotError::Check {
                    what: format!(
                        "an exact search for paper {} ({})",
                        p.paper_id,
                        describe_batches(b.batches)
                    ),
                    message: format!(
                        "it found {:?} first, not the paper itself",
                        hits.first().map(|h| (h.id, h.score))
                    ),
                });
            }
            checked += 1;
        }
        if checked >= samples {
            break;
        }
    }
    Ok(checked)
}
