//! The uploader: the run's shards into one collection, resumable, K requests in flight.
//!
//! [`upload`] is the whole job in one process: read the shards recorded in run.db, create (or
//! check) the collection, send every row not yet acknowledged, restore indexing and wait for green.
//! [`prepare`](crate::prepare()), [`send`] and [`Sink::finish`] are its steps, for the
//! multi-process server upload (`workers.rs`: the parent prepares and finishes, each worker
//! process sends its share).
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
//! **Trust.** Before resuming, the progress is checked against the collection (`open.rs`,
//! `integrity.rs`): its identity marker against the one run.db recorded (another collection:
//! everything is sent again), then each batch's acknowledged points by id (a short batch is sent
//! again alone; a tombstoned or withdrawn paper found is deleted). A tombstoned paper's row is never sent, nor
//! a row a later corpus release superseded or withdrew (`plan --update`): the newer copy of a
//! changed paper, in a newer batch, overwrites the point under the same id.
//!
//! **Failures.** A batch that still fails after the sink's retries is counted in
//! `uploads.failed_rows` and the upload goes on; the prefix stops before it, so a re-run sends it
//! again. After [`UploadOptions::max_consecutive_failures`] failures in a row the upload stops
//! (the server is down, not one batch bad) with what was acknowledged recorded.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use crossbeam_channel::{Receiver, Sender};
use embedfleet_core::rundb::{RunDb, UploadShard};

use crate::error::{UploadError, UploadRunError};
use crate::integrity::Tombstones;
use crate::ledger::{Ledger, SendReport};
use crate::open::{open_collection, shard_keys_of, OpenCollection};
use crate::options::UploadOptions;
use crate::points::PointsBatch;
use crate::prepared::Prepared;
use crate::progress::Progress;
use crate::request::UpsertRequest;
use crate::shard_keys::ShardKeys;
use crate::shards::{self, ShardReadError};
use crate::sink::Sink;
use crate::spec::{Ensured, FinishReport};

/// Test hook: milliseconds each sender sleeps before an upsert, so that a test can kill an upload
/// mid-way. Not for production use.
pub const TEST_DELAY_ENV: &str = "EMBEDFLEET_UPLOAD_TEST_DELAY_MS";

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

impl UploadReport {
    /// The report of an upload of a run with no shards.
    pub(crate) fn nothing() -> Self {
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
    upload_on(sink, &RunDb::open(&options.run_dir)?, options)
}

/// [`upload`] with the run's run.db open already (`run` holds one handle for all its stages).
pub fn upload_on(
    sink: &dyn Sink,
    db: &RunDb,
    options: &UploadOptions,
) -> Result<UploadReport, UploadRunError> {
    let Some(open) = open_collection(sink, db, options)? else {
        return Ok(UploadReport::nothing());
    };
    send_and_finish(sink, &open, options)
}

/// Sends the rest of an open collection's rows from this process, then restores indexing.
pub(crate) fn send_and_finish(
    sink: &dyn Sink,
    open: &OpenCollection,
    options: &UploadOptions,
) -> Result<UploadReport, UploadRunError> {
    let send = send(sink, open.db, &open.prepared, options)?;
    let key = crate::prepared::progress_key(sink, &options.spec.name);
    crate::restamp::after_upload(sink, open.db, &options.spec.name, &key)?;
    // Every point sent and none failed: the collection now holds the newest release (the
    // check before sending deleted what releases withdrew). `status` and `query` read it.
    open.db.record_upload_release(&key)?;
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
            PointsBatch::from_record_batch(slice).and_then(|points| {
                sink.upsert(UpsertRequest::new(collection, &points).shard_key(job.key.as_deref()))
            })
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
                    // A server that is not running: no batch after this one can do better.
                    Err(
                        e @ (UploadError::ServerRefused { .. }
                        | UploadError::NothingListens { .. }
                        | UploadError::PgUnreachable { .. }
                        | UploadError::PgNotPostgres { .. }),
                    ) => return Err(e.into()),
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
