//! The planning workers: each takes the next unplanned corpus file, reads it, writes its batch
//! files and sends what it wrote to the one thread that owns run.db (this module's `run`).

use super::known::{Held, KnownPapers};
use super::{PlanError, PlanOptions};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use embedfleet_core::batchfile::BatchWriter;
use embedfleet_core::corpus::{self, ReadError, ReadOptions, Record};
use embedfleet_core::paper::{count_chars, meta_hash, text_hash, Paper};
use embedfleet_core::quarantine::QuarantineEntry;
use embedfleet_core::rundb::{
    BatchRecord, NewMetadata, PaperMetadata, PlannedPaper, RunDb, SeenPaper,
};
use embedfleet_core::RunLayout;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Quarantine entries are sent to the run.db thread in groups of this many.
const QUARANTINE_CHUNK: usize = 512;
/// Papers an update carries unchanged are sent in groups of this many.
const SEEN_CHUNK: usize = 4096;

pub(super) struct FileTask {
    pub id: i64,
    pub path: PathBuf,
    pub size: u64,
}

enum Message {
    Batch(BatchRecord),
    Quarantine(i64, Vec<QuarantineEntry>),
    /// Papers of a file the run holds already with the same text.
    Seen(i64, Vec<SeenPaper>),
    FileDone {
        id: i64,
        summary: corpus::FileSummary,
    },
    Failed(String),
}

/// Removes the batch files of one corpus file (finished or not): they are planned again.
pub(super) fn remove_file_batches(batch_dir: &Path, file_id: i64) -> std::io::Result<()> {
    let prefix = format!("f{file_id:06}-");
    for entry in std::fs::read_dir(batch_dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

pub(super) fn run(
    db: &mut RunDb,
    tasks: &[FileTask],
    read_options: &ReadOptions,
    options: &PlanOptions,
    known: Option<&KnownPapers>,
    bytes_read: Arc<AtomicU64>,
) -> Result<KeptFieldsMissing, PlanError> {
    if tasks.is_empty() {
        return Ok(KeptFieldsMissing::default());
    }
    // Biggest files first, so the last file to finish is a small one.
    let mut order: Vec<&FileTask> = tasks.iter().collect();
    order.sort_by_key(|t| std::cmp::Reverse(t.size));
    let next = AtomicUsize::new(0);
    let (tx, rx) = crossbeam_channel::bounded(64);
    let progress = progress_bar(options.progress, tasks.iter().map(|t| t.size).sum());
    let recorded = std::thread::scope(|scope| {
        for _ in 0..options.threads.clamp(1, tasks.len()) {
            let tx = tx.clone();
            let (order, next) = (&order, &next);
            scope.spawn(move || {
                while let Some(task) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if let Err(message) = plan_file(task, read_options, options, known, &tx) {
                        let _ = tx.send(Message::Failed(message));
                        return;
                    }
                }
            });
        }
        drop(tx);
        let recorded = record(db, &rx, &progress, &bytes_read);
        // A failed record (a run.db error) must not leave the workers blocked on a full
        // channel: without a receiver their sends fail and they stop.
        drop(rx);
        recorded
    });
    progress.finish_and_clear();
    recorded
}

/// The kept fields (`--keep-field`) that no paper of the files read had; files no paper of
/// which could be used say nothing of them.
#[derive(Debug, Default)]
pub(super) struct KeptFieldsMissing(Option<std::collections::BTreeSet<String>>);

impl KeptFieldsMissing {
    fn file(&mut self, summary: &corpus::FileSummary) {
        if summary.papers == 0 {
            return;
        }
        let missing: std::collections::BTreeSet<String> =
            summary.kept_fields_missing.iter().cloned().collect();
        self.0 = Some(match self.0.take() {
            None => missing,
            Some(before) => before.intersection(&missing).cloned().collect(),
        });
    }

    pub(super) fn fields(self) -> Vec<String> {
        self.0.unwrap_or_default().into_iter().collect()
    }
}

/// Owns run.db while the workers run: records what they send, updates the progress bar.
fn record(
    db: &mut RunDb,
    rx: &Receiver<Message>,
    progress: &ProgressBar,
    bytes: &AtomicU64,
) -> Result<KeptFieldsMissing, PlanError> {
    let mut failures = Vec::new();
    let mut kept = KeptFieldsMissing::default();
    loop {
        progress.set_position(bytes.load(Ordering::Relaxed));
        let message = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(message) => message,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        match message {
            Message::Batch(batch) => {
                db.record_batch(&batch)?;
            }
            Message::Quarantine(file_id, entries) => db.record_quarantine(file_id, &entries)?,
            Message::Seen(file_id, seen) => db.record_seen(file_id, &seen)?,
            Message::FileDone { id, summary } => {
                kept.file(&summary);
                if let Some(corrupt) = &summary.corrupt {
                    progress.println(format!("warning: corpus file {id} broke off: {corrupt}"));
                }
                db.finish_file(id, &summary)?;
            }
            Message::Failed(message) => failures.push(message),
        }
    }
    if failures.is_empty() {
        Ok(kept)
    } else {
        Err(PlanError::Worker(failures.join("\n")))
    }
}

fn progress_bar(enabled: bool, total: u64) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("planning {bar:30} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}")
            .expect("the template is valid. This is a bug."),
    );
    bar
}

/// One job being filled.
struct OpenBatch {
    seq: u64,
    writer: BatchWriter,
    papers: Vec<PlannedPaper>,
}

/// The batches of one corpus file, filled in order: a full one is closed (its batch file
/// finished, its record sent to the run.db thread) before the next is opened.
struct FileBatches<'a> {
    task: &'a FileTask,
    options: &'a PlanOptions,
    tx: &'a Sender<Message>,
    open: Option<OpenBatch>,
    next_seq: u64,
}

impl FileBatches<'_> {
    /// Adds the paper at `line`, of `n_chars` characters, to the open batch, or to a new one
    /// when the open one is full.
    fn add(
        &mut self,
        line: u64,
        paper: Paper,
        n_chars: u64,
        hashes: (u64, u64),
    ) -> Result<(), String> {
        let settings = &self.options.settings;
        if let Some(batch) = &self.open {
            let full = batch.papers.len() as u64 >= settings.papers_per_job
                || settings
                    .max_job_chars
                    .is_some_and(|max| batch.writer.chars() + n_chars > max);
            if full {
                self.close_open()?;
            }
        }
        let batch = match &mut self.open {
            Some(batch) => batch,
            None => {
                let path = self
                    .options
                    .run_dir
                    .join(RunLayout::batch_file_name(self.task.id, self.next_seq));
                let writer = BatchWriter::create(&path).map_err(|e| e.to_string())?;
                self.next_seq += 1;
                self.open.insert(OpenBatch {
                    seq: self.next_seq - 1,
                    writer,
                    papers: Vec::new(),
                })
            }
        };
        batch
            .writer
            .push(line, &paper, n_chars)
            .map_err(|e| e.to_string())?;
        batch.papers.push(PlannedPaper {
            id: paper.id,
            line,
            n_chars,
            text_hash: hashes.0,
            meta_hash: hashes.1,
            file_id: None,
        });
        Ok(())
    }

    /// Closes the open batch, if any.
    fn close_open(&mut self) -> Result<(), String> {
        let Some(batch) = self.open.take() else {
            return Ok(());
        };
        let chars = batch.writer.chars();
        batch.writer.finish().map_err(|e| e.to_string())?;
        let record = BatchRecord {
            file_id: self.task.id,
            seq: batch.seq,
            path: RunLayout::batch_file_name(self.task.id, batch.seq),
            n_chars: chars,
            papers: batch.papers,
        };
        send(self.tx, Message::Batch(record))
    }
}

/// Sends `message` to the run.db thread.
fn send(tx: &Sender<Message>, message: Message) -> Result<(), String> {
    tx.send(message)
        .map_err(|_| "the run.db thread stopped".to_string())
}

/// A paper the run holds with the same text, as run.db records it: with its new metadata when
/// that changed.
fn seen_paper(line: u64, paper: Paper, held: Held, meta_hash: u64) -> SeenPaper {
    let restamp = match held {
        Held::Same => None,
        Held::Restamped { payload_changed } => Some(NewMetadata {
            meta_hash,
            payload_changed,
            metadata: PaperMetadata {
                source: paper.source,
                created: paper.created,
                added: paper.added,
                version: paper.version,
                extra: paper.extra,
            },
        }),
    };
    SeenPaper {
        line,
        id: paper.id,
        restamp,
    }
}

fn plan_file(
    task: &FileTask,
    read_options: &ReadOptions,
    options: &PlanOptions,
    known: Option<&KnownPapers>,
    tx: &Sender<Message>,
) -> Result<(), String> {
    let mut batches = FileBatches {
        task,
        options,
        tx,
        open: None,
        next_seq: 0,
    };
    let mut quarantine = Vec::new();
    let mut seen = Vec::new();
    let summary = corpus::read_file(&task.path, read_options, |record| -> Result<(), String> {
        match record {
            Record::Paper { line, paper } => {
                let hashes = (text_hash(&paper.text), meta_hash(&paper));
                if let Some(held) = known.and_then(|k| k.holds(&paper.id, hashes.0, hashes.1)) {
                    seen.push(seen_paper(line, paper, held, hashes.1));
                    if seen.len() >= SEEN_CHUNK {
                        send(tx, Message::Seen(task.id, std::mem::take(&mut seen)))?;
                    }
                    return Ok(());
                }
                let n_chars = count_chars(&paper.text);
                batches.add(line, paper, n_chars, hashes)?;
            }
            Record::Quarantined(entry) => {
                quarantine.push(entry);
                if quarantine.len() >= QUARANTINE_CHUNK {
                    let chunk = std::mem::take(&mut quarantine);
                    send(tx, Message::Quarantine(task.id, chunk))?;
                }
            }
        }
        Ok(())
    })
    .map_err(|e| match e {
        ReadError::Corpus(e) => e.to_string(),
        ReadError::Visit(e) => e,
    })?;
    batches.close_open()?;
    if !seen.is_empty() {
        send(tx, Message::Seen(task.id, seen))?;
    }
    if !quarantine.is_empty() {
        send(tx, Message::Quarantine(task.id, quarantine))?;
    }
    send(
        tx,
        Message::FileDone {
            id: task.id,
            summary,
        },
    )
}
