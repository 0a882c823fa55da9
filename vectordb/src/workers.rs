//! N upload worker processes against one Qdrant server.
//!
//! A server (or cluster) takes many clients, and the client side of an upload (reading parquet,
//! building requests, protobuf encoding, the gRPC runtime) is CPU work: N processes, each with its
//! own client and K requests in flight, keep the server busy where one process might not. The
//! parent creates the collection, re-executes the binary N times with `--worker i/N` (each takes
//! the shards with `shard_id % N == i`, so no two workers send the same shard), shows progress
//! from run.db, and restores indexing once all have exited.
//!
//! The embedded engine (qdrant-edge) is different: one process owns its directory (an OS lock,
//! see `edge.rs`), because the engine has no locking of its own and two processes writing one
//! shard corrupt it. An edge upload is therefore one process with K sender threads ([`upload`]).
//!
//! [`upload`]: super::upload

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use embedfleet_core::process;
use embedfleet_core::rundb::RunDb;

use crate::driver::{send_and_finish, UploadReport};
use crate::error::UploadRunError;
use crate::ledger::SendReport;
use crate::open::{open_collection, OpenCollection};
use crate::options::UploadOptions;
use crate::prepared::{progress_key, Prepared};
use crate::progress::Progress;
use crate::sink::Sink;

/// How long a worker gets to stop after SIGTERM before SIGKILL.
const WORKER_GRACE: Duration = Duration::from_secs(5);

/// How to start one worker process.
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    /// The `embedfleet` binary.
    pub exe: PathBuf,
    /// `upload ...` arguments shared by every worker (`--worker i/N` is appended).
    pub args: Vec<String>,
    /// Number of worker processes; `None`: one per Qdrant peer holding the collection's shards
    /// when there are several, else one per core.
    pub workers: Option<u64>,
    /// Exit code of a worker that finished with failed rows (not an error).
    pub partial_code: i32,
}

/// The upload with [`WorkerCommand::workers`] processes: see the module docs. With one worker
/// the upload runs in this process.
pub fn upload_with_workers(
    sink: &dyn Sink,
    db: &RunDb,
    options: &UploadOptions,
    command: &WorkerCommand,
) -> Result<UploadReport, UploadRunError> {
    let Some(open) = open_collection(sink, db, options)? else {
        return Ok(UploadReport::nothing());
    };
    let collection = options.spec.name.as_str();
    let key = progress_key(sink, collection);
    let workers = match command.workers {
        Some(n) => n.max(1),
        None => default_workers(match sink.qdrant() {
            Some(extras) => extras.peers(collection)?,
            None => None,
        }),
    };
    if workers == 1 {
        return send_and_finish(sink, &open, options);
    }
    let OpenCollection {
        db: _,
        prepared,
        spec,
        dim,
        ensured,
    } = open;
    let before = prepared.acked();
    tracing::info!(workers, "starting upload worker processes");
    let started = Instant::now();
    let mut children = Vec::new();
    for i in 0..workers {
        let mut cmd = Command::new(&command.exe);
        cmd.args(&command.args)
            .arg("--worker")
            .arg(format!("{i}/{workers}"));
        // Each worker leads its own process group, stopped like a scheduler's local job.
        let child = process::in_own_group(&mut cmd)
            .spawn()
            .map_err(|e| UploadRunError::Worker {
                index: i,
                why: format!("could not start {}: {e}", command.exe.display()),
            });
        match child {
            Ok(child) => children.push((i, child)),
            Err(e) => {
                kill_all(&mut children);
                return Err(e);
            }
        }
    }
    let failed_worker = watch(db, &key, &prepared, dim, children, command, options)?;
    let (acked, failed) = db.upload_totals(&key)?;
    let send = SendReport {
        points: acked.saturating_sub(before),
        failed_points: failed,
        vector_bytes: acked.saturating_sub(before) * dim as u64 * 4,
        elapsed: started.elapsed(),
        errors: Vec::new(),
    };
    if let Some(e) = failed_worker {
        return Err(e);
    }
    crate::restamp::after_upload(sink, db, collection, &key)?;
    // Every point sent and none failed: the collection now holds the newest release (the
    // check before sending deleted what releases withdrew). `status` and `query` read it.
    db.record_upload_release(&key)?;
    let finish = sink.finish(&spec)?;
    Ok(UploadReport {
        already_acked: before,
        ensured: Some(ensured),
        send,
        finish: Some(finish),
        workers,
    })
}

/// One worker per peer of a cluster (each peer's gRPC front end is then kept busy), else one per
/// core (a single server takes more than one client's worth of requests).
fn default_workers(peers: Option<usize>) -> u64 {
    match peers {
        Some(n) if n > 1 => n as u64,
        _ => std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
    }
}

/// Waits for every worker, showing progress from run.db; returns the first worker that failed.
fn watch(
    db: &RunDb,
    key: &str,
    prepared: &Prepared,
    dim: usize,
    mut children: Vec<(u64, Child)>,
    command: &WorkerCommand,
    options: &UploadOptions,
) -> Result<Option<UploadRunError>, UploadRunError> {
    let progress = Progress::new(options.progress, prepared.pending(), dim);
    let before = prepared.acked();
    let mut failed = None;
    while !children.is_empty() {
        std::thread::sleep(Duration::from_millis(300));
        let mut running = Vec::new();
        for (i, mut child) in children {
            match child.try_wait() {
                Ok(None) => running.push((i, child)),
                Ok(Some(status)) => {
                    let ok = status.success() || status.code() == Some(command.partial_code);
                    if !ok && failed.is_none() {
                        failed = Some(UploadRunError::Worker {
                            index: i,
                            why: status.to_string(),
                        });
                    }
                }
                Err(e) => {
                    if failed.is_none() {
                        failed = Some(UploadRunError::Worker {
                            index: i,
                            why: e.to_string(),
                        });
                    }
                }
            }
        }
        children = running;
        match db.upload_totals(key) {
            Ok((acked, _)) => progress.set(acked.saturating_sub(before)),
            Err(e) => {
                kill_all(&mut children);
                return Err(e.into());
            }
        }
    }
    progress.finish();
    Ok(failed)
}

/// Stops every worker: SIGTERM to its group, a grace period, SIGKILL. Safe at any moment:
/// only checkpointed rows are recorded, and a re-sent upsert batch overwrites the same points.
fn kill_all(children: &mut [(u64, Child)]) {
    for (_, child) in children {
        let _ = process::terminate_group(child, WORKER_GRACE);
    }
}

#[cfg(test)]
mod tests {
    use super::default_workers;

    #[test]
    fn one_worker_per_peer_of_a_cluster_else_per_core() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        assert_eq!(default_workers(Some(3)), 3);
        assert_eq!(default_workers(Some(1)), cores);
        assert_eq!(default_workers(None), cores);
    }
}
