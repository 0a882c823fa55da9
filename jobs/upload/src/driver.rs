//! The uploader: the run's shards into one collection, resumable, K requests in flight.
//!
//! [`upload`] is the whole job in one process: read the shards recorded in run.db, create (or
//! check) the collection, send every row not yet acknowledged, restore indexing and wait for green.
//! [`prepare`], [`send`] and [`Sink::finish`] are its steps, for the multi-process server upload
//! (`workers.rs`: the parent prepares and finishes, each worker process sends its share).
//!
//! **Threads.** One reader thread reads shards in order (only the point columns, from the first
//! row not acknowledged) in record batches of the batch size; K sender threads share the sink, so
//! K upserts are in flight; the calling thread owns run.db and the progress bar.
//!
//! **Resume.** After every `checkpoint_every` batches (or 2 s) the sink's checkpoint makes what was
//! acknowledged durable, and only then is each shard's acknowledged *prefix* written to
//! `uploads.rows_acked`. A re-run starts each shard at that row. Ids are deterministic, so rows
//! sent twice (after a kill, or out of order before a gap) are overwritten, never duplicated.
//!
//! **Trust.** Before resuming, the progress is checked against the collection (`integrity.rs`):
//! its identity marker against the one run.db recorded (another collection: everything is sent
//! again), then each batch's acknowledged points by id (a short batch is sent again alone; a
//! tombstoned or withdrawn paper found is deleted). A tombstoned paper's row is never sent, nor
//! a row a later corpus release superseded or withdrew (`plan --update`): the newer copy of a
//! changed paper, in a newer batch, overwrites the point under the same id.
//!
//! **Failures.** A batch that still fails after the sink's retries is counted in
//! `uploads.failed_rows` and the upload goes on; the prefix stops before it, so a re-run sends it
//! again. After [`UploadOptions::max_consecutive_failures`] failures in a row the upload stops
//! (the server is down, not one batch bad) with what was acknowledged recorded.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use crossbeam_channel::{Receiver, Sender};
use embedfleet_core::rundb::{RunDb, RunDbError, UploadShard};
use embedfleet_core::RunLayout;

use super::integrity::{self, Tombstones};
use super::progress::Progress;
use super::shard_keys::ShardKeys;
use super::shards::{self, ShardReadError};
use super::{CollectionSpec, Ensured, FinishReport, PointsBatch, Sink, UploadError};

/// Test hook: milliseconds each sender sleeps before an upsert, so that a test can kill an upload
/// mid-way. Not for production use.
pub const TEST_DELAY_ENV: &str = "EMBEDFLEET_UPLOAD_TEST_DELAY_MS";

/// What to upload and how.
#[derive(Debug, Clone)]
pub struct UploadOptions {
    /// The run directory (run.db and the shards).
    pub run_dir: PathBuf,
    /// The collection to create or check; `vector_size` is replaced by the shards' vector size.
    pub spec: CollectionSpec,
    /// Points per upsert.
    pub batch_size: usize,
    /// Upserts outstanding at once (sender threads).
    pub in_flight: usize,
    /// Checkpoint and record progress after this many batches (and at least every 2 s).
    pub checkpoint_every: usize,
    /// Stop after this many failed batches in a row.
    pub max_consecutive_failures: usize,
    /// Only shards with `shard_id % count == index` (a worker process's share).
    pub share: Option<(u64, u64)>,
    /// Show a progress bar on stderr.
    pub progress: bool,
}

/// Points per upsert batch when neither `--batch-size` nor `tune` says otherwise.
pub const DEFAULT_UPSERT_BATCH: usize = 256;
/// Upsert batches in flight per worker when neither `--in-flight` nor `tune` says otherwise.
pub const DEFAULT_IN_FLIGHT: usize = 4;
/// Upsert batches between checkpoints (durable, then recorded in run.db).
pub const DEFAULT_CHECKPOINT_EVERY: usize = 32;

impl UploadOptions {
    /// Upsert batches of [`DEFAULT_UPSERT_BATCH`], [`DEFAULT_IN_FLIGHT`] in flight, a
    /// checkpoint every [`DEFAULT_CHECKPOINT_EVERY`], a bulk-load collection.
    pub fn new(run_dir: impl Into<PathBuf>, collection: impl Into<String>) -> Self {
        Self {
            run_dir: run_dir.into(),
            spec: CollectionSpec {
                bulk_load: true,
                ..CollectionSpec::new(collection, 0)
            },
            batch_size: DEFAULT_UPSERT_BATCH,
            in_flight: DEFAULT_IN_FLIGHT,
            checkpoint_every: DEFAULT_CHECKPOINT_EVERY,
            max_consecutive_failures: 16,
            share: None,
            progress: false,
        }
    }
}

/// Why an upload could not run (rows that failed are not errors: see [`SendReport`]).
#[derive(Debug, thiserror::Error)]
pub enum UploadRunError {
    /// run.db could not be read or written.
    #[error(transparent)]
    RunDb(#[from] RunDbError),
    /// The sink refused or failed.
    #[error(transparent)]
    Sink(#[from] UploadError),
    /// A shard's footer could not be read.
    #[error(transparent)]
    Shard(#[from] ShardReadError),
    /// The run's shards do not all have one vector size.
    #[error("shard {} has {found}-d vectors but {first} has {expected}-d; one collection holds one vector size: upload the runs of different models or dimensions into different collections", path.display())]
    MixedDims {
        /// The shard that differs.
        path: PathBuf,
        /// Its vector size.
        found: usize,
        /// The first shard.
        first: PathBuf,
        /// The first shard's vector size.
        expected: usize,
    },
    /// The run's shard-key pin (`snapshots/keys.json`) could not be read.
    #[error("failed to read the run's shard keys (snapshots/keys.json): {0}")]
    ShardKeys(std::io::Error),
    /// Too many batches in a row failed; the upload stopped.
    #[error("the upload stopped after {failures} failed batches in a row (last: {last}); what was acknowledged is recorded, run `embedfleet upload` again once the cause is fixed")]
    TooManyFailures {
        /// Consecutive failed batches.
        failures: usize,
        /// The last error.
        last: String,
    },
    /// A worker process failed.
    #[error("upload worker {index} failed: {why}; run `embedfleet upload` again, it continues")]
    Worker {
        /// The worker's index.
        index: u64,
        /// Its exit status or spawn error.
        why: String,
    },
}

impl UploadRunError {
    /// True when the target collection refused the run's vectors: exit code "refused".
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            UploadRunError::MixedDims { .. }
                | UploadRunError::Sink(
                    UploadError::CollectionMismatch { .. }
                        | UploadError::VectorSizeMismatch { .. }
                        | UploadError::KeyOfAnotherRun(_)
                )
        )
    }
}

/// The shards of a run, with the vector size of those still to send.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Every shard, with its progress into the collection.
    pub shards: Vec<UploadShard>,
    /// Vector size of the shards (`None` when the run has no shard yet).
    pub dim: Option<usize>,
}

impl Prepared {
    /// Rows acknowledged before this upload.
    pub fn acked(&self) -> u64 {
        self.shards.iter().map(|s| s.rows_acked.min(s.rows)).sum()
    }

    /// Rows still to send.
    pub fn pending(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.rows.saturating_sub(s.rows_acked))
            .sum()
    }
}

/// Where run.db keeps the upload progress into `collection` of `sink`: the collection *and* the
/// target (`papers@edge:/runs/r1/qdrant`, `papers@server:http://q:6334`), so progress into one
/// Qdrant never counts for another.
pub fn progress_key(sink: &dyn Sink, collection: &str) -> String {
    format!("{collection}@{}", sink.target())
}

/// Reads the run's shards, with their progress under `key` ([`progress_key`]), and checks they
/// share one vector size.
pub fn prepare(db: &RunDb, key: &str) -> Result<Prepared, UploadRunError> {
    let shards = db.upload_shards(key)?;
    let mut dim: Option<(usize, PathBuf)> = None;
    for shard in &shards {
        let path = db.dir().join(&shard.path);
        // Shards already sent were checked when they were sent; reading every footer of a big run
        // again costs a file open each.
        if shard.is_done() && dim.is_some() {
            continue;
        }
        let found = shards::shard_dim(&path)?;
        match &dim {
            None => dim = Some((found, path)),
            Some((expected, first)) if *expected != found => {
                return Err(UploadRunError::MixedDims {
                    path,
                    found,
                    first: first.clone(),
                    expected: *expected,
                })
            }
            Some(_) => {}
        }
    }
    Ok(Prepared {
        shards,
        dim: dim.map(|(d, _)| d),
    })
}

/// What one [`send`] did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SendReport {
    /// Points acknowledged now.
    pub points: u64,
    /// Points in batches that failed after every retry (or in shards that could not be read).
    pub failed_points: u64,
    /// Bytes of vectors acknowledged now.
    pub vector_bytes: u64,
    /// Wall time of sending.
    pub elapsed: Duration,
    /// The first distinct errors (at most 5).
    pub errors: Vec<String>,
}

impl SendReport {
    /// Points per second.
    pub fn points_per_s(&self) -> f64 {
        self.points as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// What [`upload`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct UploadReport {
    /// Rows acknowledged before this upload.
    pub already_acked: u64,
    /// The collection was created or existed (`None`: the run has no shards).
    pub ensured: Option<Ensured>,
    /// The sending.
    pub send: SendReport,
    /// Indexing restored and green (`None`: nothing was sent and the collection was not touched).
    pub finish: Option<FinishReport>,
    /// Processes that sent (1: this one).
    pub workers: u64,
}

/// A collection ready to receive a run's shards (see [`open_collection`]).
pub(super) struct OpenCollection {
    pub db: RunDb,
    pub prepared: Prepared,
    /// The spec with the shards' vector size, as created or checked.
    pub spec: CollectionSpec,
    pub dim: usize,
    pub ensured: Ensured,
}

/// Reads what is left to send and creates or checks the collection; `None` when the run has no
/// shards yet. Shared by the in-process upload and the parent of the worker processes.
pub(super) fn open_collection(
    sink: &dyn Sink,
    options: &UploadOptions,
) -> Result<Option<OpenCollection>, UploadRunError> {
    let db = RunDb::open(&options.run_dir)?;
    let key = progress_key(sink, &options.spec.name);
    let name = options.spec.name.as_str();
    let mut prepared = prepare(&db, &key)?;
    let Some(dim) = prepared.dim else {
        return Ok(None);
    };
    // Progress is only as good as the collection it is about (see `integrity`): first the
    // collection's identity, then each batch's points.
    let exists = sink.collection_info(name)?.is_some();
    let found_marker = if exists {
        sink.collection_marker(name)?
    } else {
        None
    };
    let recorded_marker = db.upload_marker(&key)?;
    if prepared.acked() > 0
        && integrity::is_another_collection(
            recorded_marker.as_deref(),
            exists,
            found_marker.as_deref(),
        )
    {
        eprintln!(
            "note: `{name}` was dropped or replaced since this run uploaded into it ({}): sending every point again",
            if exists {
                "its identity marker is not the one run.db recorded: made again, or another run's"
            } else {
                "it is gone"
            }
        );
        db.forget_uploads(&key)?;
        prepared = prepare(&db, &key)?;
    }
    let tombstones = integrity::Tombstones::read(&db)?;
    if exists && prepared.acked() > 0 {
        let keys = shard_keys_of(sink, &db, name)?;
        let check =
            integrity::check_batches(sink, &db, &key, name, &prepared, &tombstones, keys.as_ref())?;
        if !check.resent.is_empty() {
            prepared = prepare(&db, &key)?;
        }
    }
    // Nothing left to send: indexing is not deferred again (on a server that could rebuild the
    // index), but `finish` still restores it, in case a killed upload left it deferred.
    let spec = CollectionSpec {
        vector_size: dim,
        bulk_load: options.spec.bulk_load && prepared.pending() > 0,
        ..options.spec.clone()
    };
    let ensured = sink.ensure_collection(&spec)?;
    integrity::record_marker::<UploadRunError>(sink, &db, &key, name, found_marker)?;
    // A collection loaded from built shards has a shard key per group of batches: every write
    // names its batch's key, and a batch loaded no other way gets its key here, before any
    // write, owned by this run (another run's key is refused).
    if let Some(keys) = shard_keys_of(sink, &db, &spec.name)? {
        let batches: Vec<i64> = prepared
            .shards
            .iter()
            .filter(|s| !s.is_done())
            .map(|s| s.batch_id)
            .collect();
        let mut groups: Vec<i64> = batches.iter().map(|&b| keys.group_of(b)).collect();
        groups.dedup();
        for group in groups {
            let owner = keys.owner_of_group(group, db.dir());
            sink.ensure_shard_key(&spec.name, &keys.key_of_group(group), &owner)?;
        }
    }
    Ok(Some(OpenCollection {
        db,
        prepared,
        spec,
        dim,
        ensured,
    }))
}

impl UploadReport {
    /// The report of an upload of a run with no shards.
    pub(super) fn nothing() -> Self {
        Self {
            already_acked: 0,
            ensured: None,
            send: SendReport::default(),
            finish: None,
            workers: 1,
        }
    }
}

/// The whole upload in this process: prepare, create or check the collection, send, finish.
pub fn upload(sink: &dyn Sink, options: &UploadOptions) -> Result<UploadReport, UploadRunError> {
    let Some(open) = open_collection(sink, options)? else {
        return Ok(UploadReport::nothing());
    };
    send_and_finish(sink, &open, options)
}

/// Sends the rest of an open collection's rows from this process, then restores indexing.
pub(super) fn send_and_finish(
    sink: &dyn Sink,
    open: &OpenCollection,
    options: &UploadOptions,
) -> Result<UploadReport, UploadRunError> {
    let send = send(sink, &open.db, &open.prepared, options)?;
    let finish = sink.finish(&open.spec)?;
    Ok(UploadReport {
        already_acked: open.prepared.acked(),
        ensured: Some(open.ensured),
        send,
        finish: Some(finish),
        workers: 1,
    })
}

/// One batch of rows of one shard.
struct Job {
    shard: usize,
    /// The batch the shard is part of.
    batch_id: i64,
    start: u64,
    batch: RecordBatch,
    /// The shard key of the shard's batch, in a custom-sharded collection.
    key: Option<String>,
}

/// What came back from a sender or the reader.
enum Done {
    Sent {
        shard: usize,
        start: u64,
        len: u64,
        /// Rows of the range not sent: their papers are tombstoned.
        skipped: u64,
        result: Result<(), UploadError>,
    },
    /// Rows from `from` on of a shard could not be read.
    Unreadable {
        shard: usize,
        from: u64,
        error: ShardReadError,
    },
}

/// Sends the rows of `prepared` not yet acknowledged (this process's share of them) into
/// `options.spec.name`, recording progress in `db`. The collection must exist.
pub fn send(
    sink: &dyn Sink,
    db: &RunDb,
    prepared: &Prepared,
    options: &UploadOptions,
) -> Result<SendReport, UploadRunError> {
    let todo: Vec<UploadShard> = prepared
        .shards
        .iter()
        .filter(|s| !s.is_done())
        .filter(|s| {
            options
                .share
                .is_none_or(|(i, n)| s.shard_id as u64 % n == i)
        })
        .cloned()
        .collect();
    let total: u64 = todo.iter().map(|s| s.rows - s.rows_acked).sum();
    let progress = Progress::new(options.progress, total, prepared.dim.unwrap_or(0));
    let in_flight = options.in_flight.max(1);
    let delay = test_delay();
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let mut ledger = Ledger::new(&todo, prepared.dim.unwrap_or(0));
    let keys = if todo.is_empty() {
        None
    } else {
        shard_keys_of(sink, db, &options.spec.name)?
    };
    // A paper deleted from the run (`embedfleet delete`) is never sent again.
    let tombstones = Tombstones::read(db)?;
    let result = std::thread::scope(|scope| {
        let (job_tx, job_rx) = crossbeam_channel::bounded::<Job>(in_flight);
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<Done>();
        {
            let (todo, stop, done_tx) = (&todo, &stop, done_tx.clone());
            let dir = db.dir();
            scope.spawn(move || {
                read_shards(dir, todo, options.batch_size, keys, job_tx, done_tx, stop)
            });
        }
        for _ in 0..in_flight {
            let (job_rx, done_tx, stop) = (job_rx.clone(), done_tx.clone(), &stop);
            let collection = options.spec.name.as_str();
            let tombstones = &tombstones;
            scope.spawn(move || {
                send_jobs(sink, collection, tombstones, job_rx, done_tx, stop, delay)
            });
        }
        drop((job_rx, done_tx));
        let result = collect(sink, db, options, &mut ledger, &done_rx, &progress);
        if result.is_err() {
            stop.store(true, Ordering::Relaxed);
            while done_rx.recv().is_ok() {}
        }
        result
    });
    progress.finish();
    // Whatever happened, what was acknowledged is made durable and recorded.
    let recorded = ledger.checkpoint(sink, db, &options.spec.name);
    result?;
    recorded?;
    Ok(SendReport {
        elapsed: started.elapsed(),
        ..ledger.report
    })
}

fn test_delay() -> Option<Duration> {
    std::env::var(TEST_DELAY_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis)
}

/// The run's shard keys when `collection` is custom-sharded (loaded from built shards), so
/// that every write names its batch's key; `None` for an ordinary collection.
pub fn shard_keys_of(
    sink: &dyn Sink,
    db: &RunDb,
    collection: &str,
) -> Result<Option<ShardKeys>, UploadRunError> {
    if !sink.keyed(collection)? {
        return Ok(None);
    }
    ShardKeys::for_writes(&RunLayout::new(db.dir()))
        .map(Some)
        .map_err(UploadRunError::ShardKeys)
}

/// The reader thread: every shard's pending rows as jobs, in order.
fn read_shards(
    dir: &Path,
    todo: &[UploadShard],
    batch_size: usize,
    keys: Option<ShardKeys>,
    jobs: Sender<Job>,
    done: Sender<Done>,
    stop: &AtomicBool,
) {
    for (i, shard) in todo.iter().enumerate() {
        let key = keys.as_ref().map(|k| k.key_of(shard.batch_id));
        let mut start = shard.rows_acked;
        let reader = match shards::read_from(&dir.join(&shard.path), start, batch_size) {
            Ok(reader) => reader,
            Err(error) => {
                let _ = done.send(Done::Unreadable {
                    shard: i,
                    from: start,
                    error,
                });
                continue;
            }
        };
        for batch in reader {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let batch = match batch {
                Ok(batch) => batch,
                Err(e) => {
                    let error = ShardReadError {
                        path: dir.join(&shard.path),
                        message: e.to_string(),
                    };
                    let _ = done.send(Done::Unreadable {
                        shard: i,
                        from: start,
                        error,
                    });
                    break;
                }
            };
            let len = batch.num_rows() as u64;
            if jobs
                .send(Job {
                    shard: i,
                    batch_id: shard.batch_id,
                    start,
                    batch,
                    key: key.clone(),
                })
                .is_err()
            {
                return;
            }
            start += len;
        }
    }
}

/// A sender thread: upserts jobs until the reader is done (or the upload stops).
fn send_jobs(
    sink: &dyn Sink,
    collection: &str,
    tombstones: &Tombstones,
    jobs: Receiver<Job>,
    done: Sender<Done>,
    stop: &AtomicBool,
    delay: Option<Duration>,
) {
    for job in jobs {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        if let Some(delay) = delay {
            std::thread::sleep(delay);
        }
        let live = tombstones.live_slices(job.batch_id, &job.batch);
        let skipped = job.batch.num_rows() - live.iter().map(RecordBatch::num_rows).sum::<usize>();
        let result = live.iter().try_for_each(|slice| {
            PointsBatch::from_record_batch(slice)
                .and_then(|points| sink.upsert_keyed(collection, job.key.as_deref(), &points))
        });
        let sent = Done::Sent {
            shard: job.shard,
            start: job.start,
            len: job.batch.num_rows() as u64,
            skipped: skipped as u64,
            result,
        };
        if done.send(sent).is_err() {
            return;
        }
    }
}

/// The calling thread: results in, checkpoints and run.db records out.
fn collect(
    sink: &dyn Sink,
    db: &RunDb,
    options: &UploadOptions,
    ledger: &mut Ledger,
    done: &Receiver<Done>,
    progress: &Progress,
) -> Result<(), UploadRunError> {
    const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(2);
    let mut since_checkpoint = 0usize;
    let mut last_checkpoint = Instant::now();
    let mut consecutive_failures = 0usize;
    loop {
        let wait = CHECKPOINT_INTERVAL.saturating_sub(last_checkpoint.elapsed());
        match done.recv_timeout(wait) {
            Ok(Done::Sent {
                shard,
                start,
                len,
                skipped,
                result,
            }) => {
                since_checkpoint += 1;
                match result {
                    Ok(()) => {
                        consecutive_failures = 0;
                        ledger.acked(shard, start, len, skipped);
                        progress.add(len);
                    }
                    // A wrong vector size is the run's fault, not the batch's: stop.
                    Err(e @ UploadError::VectorSizeMismatch { .. }) => return Err(e.into()),
                    Err(e) => {
                        consecutive_failures += 1;
                        ledger.failed(shard, len, &e.to_string());
                        progress.add(len);
                        if consecutive_failures >= options.max_consecutive_failures.max(1) {
                            return Err(UploadRunError::TooManyFailures {
                                failures: consecutive_failures,
                                last: e.to_string(),
                            });
                        }
                    }
                }
            }
            Ok(Done::Unreadable { shard, from, error }) => {
                ledger.unreadable(shard, from, &error.to_string());
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Ok(()),
        }
        if since_checkpoint >= options.checkpoint_every.max(1)
            || last_checkpoint.elapsed() >= CHECKPOINT_INTERVAL
        {
            ledger.checkpoint(sink, db, &options.spec.name)?;
            since_checkpoint = 0;
            last_checkpoint = Instant::now();
        }
    }
}

/// Per shard: the acknowledged prefix, the batches acknowledged beyond a gap, failed rows.
struct ShardLedger {
    shard_id: i64,
    rows: u64,
    /// Rows `0..prefix` are acknowledged.
    prefix: u64,
    /// Acknowledged batches after a gap: start -> len.
    ahead: std::collections::BTreeMap<u64, u64>,
    failed: u64,
    /// Changed since the last record.
    dirty: bool,
}

struct Ledger {
    shards: Vec<ShardLedger>,
    dim: usize,
    report: SendReport,
}

impl Ledger {
    fn new(todo: &[UploadShard], dim: usize) -> Self {
        let shards = todo
            .iter()
            .map(|s| ShardLedger {
                shard_id: s.shard_id,
                rows: s.rows,
                prefix: s.rows_acked,
                ahead: Default::default(),
                failed: 0,
                // A shard that failed before is recorded again even if nothing fails now.
                dirty: s.failed_rows > 0,
            })
            .collect();
        Self {
            shards,
            dim,
            report: SendReport::default(),
        }
    }

    /// Rows `start..start + len` are done: acknowledged, or (`skipped` of them) tombstoned.
    fn acked(&mut self, shard: usize, start: u64, len: u64, skipped: u64) {
        let sent = len - skipped;
        self.report.points += sent;
        self.report.vector_bytes += sent * self.dim as u64 * 4;
        let s = &mut self.shards[shard];
        s.ahead.insert(start, len);
        while let Some(len) = s.ahead.remove(&s.prefix) {
            s.prefix += len;
        }
        s.dirty = true;
    }

    fn failed(&mut self, shard: usize, len: u64, error: &str) {
        self.report.failed_points += len;
        self.note(error);
        let s = &mut self.shards[shard];
        s.failed += len;
        s.dirty = true;
    }

    fn unreadable(&mut self, shard: usize, from: u64, error: &str) {
        let s = &mut self.shards[shard];
        let lost = s.rows.saturating_sub(from);
        s.failed += lost;
        s.dirty = true;
        self.report.failed_points += lost;
        self.note(error);
    }

    fn note(&mut self, error: &str) {
        if self.report.errors.len() < 5 && !self.report.errors.iter().any(|e| e == error) {
            tracing::warn!("{error}");
            self.report.errors.push(error.to_owned());
        }
    }

    /// Makes the acknowledged upserts durable, then records every changed shard.
    fn checkpoint(
        &mut self,
        sink: &dyn Sink,
        db: &RunDb,
        collection: &str,
    ) -> Result<(), UploadRunError> {
        if !self.shards.iter().any(|s| s.dirty) {
            return Ok(());
        }
        sink.checkpoint(collection)?;
        let key = progress_key(sink, collection);
        for s in self.shards.iter_mut().filter(|s| s.dirty) {
            db.record_upload(s.shard_id, &key, s.prefix.min(s.rows), s.failed)?;
            s.dirty = false;
        }
        Ok(())
    }
}
