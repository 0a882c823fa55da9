//! Corpus releases: the first plan is release 1, each `plan --update` adds the next.
//!
//! An update plans only what the release changes. Its planner skips the papers the run already
//! holds with the same text (recording where it saw them, in `release_seen`) and plans the rest
//! into new batches, as a first plan would. Once every file of the release is planned,
//! [`RunDb::resolve_release`] settles it in one transaction:
//! - duplicates within the release, over both kinds of occurrence, first in corpus order wins;
//! - the older copy of each paper the release plans again is `superseded_in` the release;
//! - the older copy of each paper the release does not carry is `withdrawn_in` it (unless the
//!   release only adds);
//! - the counts go to the release's row, and it is planned.
//!
//! A paper row is *live* (served by every later stage) while it is neither a duplicate,
//! superseded nor withdrawn. Tombstones (`embedfleet delete`) are apart: a deleted paper stays
//! deleted in every release.

use super::error::{sqlite_err, Result};
use super::handle::RunDb;
use crate::quarantine::QuarantineReason;
use rusqlite::{params, OptionalExtension};

/// A release as run.db records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub id: i64,
    /// Papers absent from the release are kept, not withdrawn.
    pub only_adds: bool,
    /// The command line that started it.
    pub command: Option<String>,
    pub started_at: String,
    /// `None` while it is being planned.
    pub planned_at: Option<String>,
    pub counts: Option<ReleaseCounts>,
}

/// What a release changed, by paper.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReleaseCounts {
    /// Ids the run did not hold (all of release 1's).
    pub added: u64,
    /// Ids whose text changed: planned again, their older copy superseded.
    pub changed: u64,
    /// Ids the release does not carry: their copy withdrawn.
    pub withdrawn: u64,
    /// Ids carried with the same text: nothing to embed.
    pub unchanged: u64,
    /// Of `unchanged`, those whose corpus metadata changed (`version`, `added`, `created`,
    /// `source`, kept fields): the new values are served without embedding them again.
    #[serde(default)]
    pub restamped: u64,
}

impl ReleaseCounts {
    /// Papers the release has to embed.
    pub fn to_embed(&self) -> u64 {
        self.added + self.changed
    }
}

/// A live paper of the run before a release, for the planner's comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownPaper {
    pub id: String,
    /// xxh3-64 of its text; `None` for a row planned before text hashes were recorded.
    pub text_hash: Option<u64>,
    /// Its metadata's hash as served now (a later release may have restamped it); `None` for
    /// a row planned before metadata hashes were recorded.
    pub meta_hash: Option<u64>,
    pub batch_id: i64,
    pub row: u64,
}

/// The batches (by file) of a release, as an SQL condition on a batch id column.
fn in_release(column: &str, op: &str) -> String {
    format!(
        "{column} IN (SELECT b.id FROM batches b JOIN corpus_files f ON f.id = b.file_id WHERE f.release {op} ?1)"
    )
}

/// The corpus metadata of a paper, as a release gave it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PaperMetadata {
    pub source: Option<String>,
    pub created: Option<String>,
    pub added: Option<String>,
    pub version: Option<String>,
    /// The kept fields (`--keep-field`), one JSON object.
    pub extra: Option<String>,
}

/// A paper a release carries with the same text: where it was seen, and its new metadata when
/// that changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenPaper {
    pub line: u64,
    pub id: String,
    pub restamp: Option<NewMetadata>,
}

/// The metadata a release gives a paper it carries with the same text but other metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMetadata {
    /// [`crate::paper::meta_hash`] of it.
    pub meta_hash: u64,
    /// What the collection's payload holds of it (`source`, the year) changed too.
    pub payload_changed: bool,
    pub metadata: PaperMetadata,
}

/// A live paper row whose metadata a later release changed: the values to serve instead of
/// its shard's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restamp {
    /// The batch of the live row (its shard holds the older metadata).
    pub batch_id: i64,
    pub paper_id: String,
    /// The newest release that restamped it.
    pub release: i64,
    /// Some release since the row was planned changed its payload part (`source`, the year):
    /// a collection's point needs its payload set.
    pub payload_changed: bool,
    pub metadata: PaperMetadata,
    /// [`crate::paper::meta_hash`] of `metadata`.
    pub meta_hash: u64,
}

const LIVE: &str = "duplicate_of IS NULL AND superseded_in IS NULL AND withdrawn_in IS NULL";

/// A paper row a later release took out of service: its batch no longer serves it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct WithheldRow {
    pub batch_id: i64,
    pub paper_id: String,
    /// No live copy of the paper is left (withdrawn, and not planned again since): its point
    /// is to be deleted. Otherwise a newer row serves the same id (the same point).
    pub gone: bool,
    /// The batch of the row that serves the paper now, when one does: a custom-sharded
    /// collection holds the old row's point in the old batch's key, apart from the new one's.
    pub live_batch: Option<i64>,
}

impl RunDb {
    /// The rows later releases superseded or withdrew, in batch and paper order. Few: what the
    /// releases changed, not the run.
    pub fn withheld_rows(&self) -> Result<Vec<WithheldRow>> {
        let sql = format!(
            "SELECT p.batch_id, p.id, (SELECT q.batch_id FROM papers q WHERE q.id = p.id AND q.{} LIMIT 1)
             FROM papers p WHERE p.superseded_in IS NOT NULL OR p.withdrawn_in IS NOT NULL
             ORDER BY p.batch_id, p.id",
            LIVE.replace(" AND ", " AND q.")
        );
        let mut stmt = self.conn.prepare(&sql).map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([], |r| {
            let live_batch: Option<i64> = r.get(2)?;
            Ok(WithheldRow {
                batch_id: r.get(0)?,
                paper_id: r.get(1)?,
                gone: live_batch.is_none(),
                live_batch,
            })
        });
        rows.and_then(|r| r.collect::<rusqlite::Result<_>>())
            .map_err(sqlite_err(&self.dir))
    }

    /// The rows a collection brought up to `release` no longer serves: superseded or withdrawn
    /// by that release or an earlier one, as (batch, paper id). Few, as [`RunDb::withheld_rows`].
    pub fn rows_withheld_by(&self, release: i64) -> Result<Vec<(i64, String)>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT batch_id, id FROM papers
                 WHERE (superseded_in IS NOT NULL OR withdrawn_in IS NOT NULL)
                     AND (superseded_in <= ?1 OR withdrawn_in <= ?1)
                 ORDER BY batch_id, id",
            )
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([release], |r| Ok((r.get(0)?, r.get(1)?)));
        rows.and_then(|r| r.collect::<rusqlite::Result<_>>())
            .map_err(sqlite_err(&self.dir))
    }

    /// The batches of releases after `release`: rows a collection brought up to `release`
    /// does not hold yet.
    pub fn batches_after_release(&self, release: i64) -> Result<Vec<i64>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT b.id FROM batches b JOIN corpus_files f ON f.id = b.file_id
                 WHERE f.release > ?1 ORDER BY b.id",
            )
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([release], |r| r.get(0));
        rows.and_then(|r| r.collect::<rusqlite::Result<_>>())
            .map_err(sqlite_err(&self.dir))
    }

    /// The newest release planned to its end, if any.
    pub fn newest_planned_release(&self) -> Result<Option<i64>> {
        self.conn
            .query_row(
                "SELECT max(id) FROM releases WHERE planned_at IS NOT NULL",
                [],
                |r| r.get(0),
            )
            .map_err(sqlite_err(&self.dir))
    }

    /// Every release, in order.
    pub fn releases(&self) -> Result<Vec<Release>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT id, only_adds, command, started_at, planned_at, added, changed, withdrawn,
                     unchanged, coalesce(restamped, 0)
                 FROM releases ORDER BY id",
            )
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([], |r| {
            let counts = match r.get::<_, Option<u64>>(5)? {
                Some(added) => Some(ReleaseCounts {
                    added,
                    changed: r.get(6)?,
                    withdrawn: r.get(7)?,
                    unchanged: r.get(8)?,
                    restamped: r.get(9)?,
                }),
                None => None,
            };
            Ok(Release {
                id: r.get(0)?,
                only_adds: r.get(1)?,
                command: r.get(2)?,
                started_at: r.get(3)?,
                planned_at: r.get(4)?,
                counts,
            })
        });
        rows.and_then(|r| r.collect::<rusqlite::Result<_>>())
            .map_err(sqlite_err(&self.dir))
    }

    /// The newest release, planned or being planned.
    pub fn latest_release(&self) -> Result<Option<Release>> {
        Ok(self.releases()?.pop())
    }

    /// Starts the next release (1 for a first plan) and returns its number.
    pub fn begin_release(&self, only_adds: bool, command: &str) -> Result<i64> {
        self.conn
            .execute(
                "INSERT INTO releases (id, only_adds, command, started_at)
                 VALUES ((SELECT coalesce(max(id), 0) + 1 FROM releases), ?1, ?2,
                         strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
                params![only_adds, command],
            )
            .map_err(sqlite_err(&self.dir))?;
        Ok(self.conn.last_insert_rowid())
    }

    /// The live papers of the releases before `release`, for the planner of `release` to
    /// compare with, in batch and row order.
    pub fn known_papers(&self, release: i64) -> Result<Vec<KnownPaper>> {
        let sql = format!(
            "SELECT id, text_hash, batch_id, row, meta_hash FROM papers WHERE {LIVE} AND {}
             ORDER BY batch_id, row",
            in_release("batch_id", "<")
        );
        let mut stmt = self.conn.prepare(&sql).map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([release], |r| {
            Ok(KnownPaper {
                id: r.get(0)?,
                text_hash: r.get::<_, Option<i64>>(1)?.map(|h| h as u64),
                batch_id: r.get(2)?,
                row: r.get(3)?,
                meta_hash: r.get::<_, Option<i64>>(4)?.map(|h| h as u64),
            })
        });
        rows.and_then(|r| r.collect::<rusqlite::Result<_>>())
            .map_err(sqlite_err(&self.dir))
    }

    /// Records the text and metadata hashes of papers planned before they were recorded:
    /// `(batch_id, row, text hash, metadata hash)`. A hash recorded already is kept (a
    /// restamped row's metadata hash is the release's, not its batch file's).
    pub fn record_hashes(&mut self, hashes: &[(i64, u64, u64, u64)]) -> Result<()> {
        let tx = self.conn.transaction().map_err(sqlite_err(&self.dir))?;
        {
            let mut update = tx
                .prepare_cached(
                    "UPDATE papers SET text_hash = coalesce(text_hash, ?3),
                         meta_hash = coalesce(meta_hash, ?4)
                     WHERE batch_id = ?1 AND row = ?2",
                )
                .map_err(sqlite_err(&self.dir))?;
            for (batch, row, text, meta) in hashes {
                update
                    .execute(params![batch, row, *text as i64, *meta as i64])
                    .map_err(sqlite_err(&self.dir))?;
            }
        }
        tx.commit().map_err(sqlite_err(&self.dir))
    }

    /// Records papers of a corpus file that the release carries with the same text, with their
    /// new metadata where it changed.
    pub fn record_seen(&mut self, file_id: i64, seen: &[SeenPaper]) -> Result<()> {
        let tx = self.conn.transaction().map_err(sqlite_err(&self.dir))?;
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO release_seen (release, file_id, line, id, meta_hash, payload_changed,
                         source, created, added, version, extra)
                     VALUES ((SELECT release FROM corpus_files WHERE id = ?1), ?1, ?2, ?3, ?4, ?5,
                         ?6, ?7, ?8, ?9, ?10)",
                )
                .map_err(sqlite_err(&self.dir))?;
            for paper in seen {
                let new = paper.restamp.as_ref();
                let m = new.map(|n| &n.metadata);
                insert
                    .execute(params![
                        file_id,
                        paper.line,
                        paper.id,
                        new.map(|n| n.meta_hash as i64),
                        new.is_some_and(|n| n.payload_changed),
                        m.and_then(|m| m.source.as_deref()),
                        m.and_then(|m| m.created.as_deref()),
                        m.and_then(|m| m.added.as_deref()),
                        m.and_then(|m| m.version.as_deref()),
                        m.and_then(|m| m.extra.as_deref()),
                    ])
                    .map_err(sqlite_err(&self.dir))?;
            }
        }
        tx.commit().map_err(sqlite_err(&self.dir))
    }

    /// True when some release restamped a paper (by index).
    pub fn has_restamps(&self) -> Result<bool> {
        self.conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM release_seen WHERE meta_hash IS NOT NULL)",
                [],
                |r| r.get(0),
            )
            .map_err(sqlite_err(&self.dir))
    }

    /// True when some release changed a paper's payload part (`source`, the year) without its
    /// text: a look by index before [`RunDb::payload_restamps`], which every upload makes.
    pub fn has_payload_restamps(&self) -> Result<bool> {
        self.conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM release_seen WHERE payload_changed)",
                [],
                |r| r.get(0),
            )
            .map_err(sqlite_err(&self.dir))
    }

    /// The live rows whose metadata a settled release changed after they were planned, with
    /// the newest values, in batch and paper order. Papers deleted from the run are left out.
    /// What a published dataset writes: for a release that stamps every paper, every paper.
    pub fn restamps(&self) -> Result<Vec<Restamp>> {
        self.restamps_where(false, None)
    }

    /// [`RunDb::restamps`] of batch `batch` alone (by index: a batch at a time, so that a
    /// release restamping the whole corpus is never held in memory at once).
    pub fn restamps_of_batch(&self, batch: i64) -> Result<Vec<Restamp>> {
        self.restamps_where(false, Some(batch))
    }

    /// [`RunDb::restamps`] of the rows whose payload part changed since they were planned:
    /// what a collection needs set. Few, whatever the release stamps: found from the rows that
    /// changed the payload (by index), not from every restamped paper.
    pub fn payload_restamps(&self) -> Result<Vec<Restamp>> {
        self.restamps_where(true, None)
    }

    fn restamps_where(&self, payload_only: bool, batch: Option<i64>) -> Result<Vec<Restamp>> {
        const SETTLED: &str = "(SELECT id FROM releases WHERE planned_at IS NOT NULL)";
        // The papers to look at: every restamped one, or those a release changed the payload
        // of (by the partial index on `payload_changed`).
        let papers = if payload_only {
            "AND s.id IN (SELECT id FROM release_seen WHERE payload_changed)"
        } else {
            ""
        };
        // Some settled release since the live row's changed the payload part.
        let payload_changed = format!(
            "EXISTS (SELECT 1 FROM release_seen t WHERE t.id = s.id AND t.meta_hash IS NOT NULL
                     AND t.duplicate_of IS NULL AND t.payload_changed AND t.release > f.release
                     AND t.release IN {SETTLED})"
        );
        let sql = format!(
            "SELECT p.batch_id, s.id, s.release, {payload_changed},
                 s.source, s.created, s.added, s.version, s.extra, s.meta_hash
             FROM papers p
             JOIN release_seen s ON s.id = p.id AND p.{live}
             JOIN batches b ON b.id = p.batch_id JOIN corpus_files f ON f.id = b.file_id
             WHERE s.meta_hash IS NOT NULL AND s.duplicate_of IS NULL AND s.release > f.release
               AND s.release = (SELECT max(t.release) FROM release_seen t WHERE t.id = s.id
                                AND t.meta_hash IS NOT NULL AND t.duplicate_of IS NULL
                                AND t.release IN {SETTLED})
               AND s.id NOT IN (SELECT paper_id FROM tombstones)
               {papers} {payload} {of_batch}
             ORDER BY p.batch_id, s.id",
            live = LIVE.replace(" AND ", " AND p."),
            payload = if payload_only {
                format!("AND {payload_changed}")
            } else {
                String::new()
            },
            of_batch = batch.map_or(String::new(), |b| format!("AND p.batch_id = {b}")),
        );
        let mut stmt = self.conn.prepare(&sql).map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([], |r| {
            Ok(Restamp {
                batch_id: r.get(0)?,
                paper_id: r.get(1)?,
                release: r.get(2)?,
                payload_changed: r.get(3)?,
                metadata: PaperMetadata {
                    source: r.get(4)?,
                    created: r.get(5)?,
                    added: r.get(6)?,
                    version: r.get(7)?,
                    extra: r.get(8)?,
                },
                meta_hash: r.get::<_, i64>(9)? as u64,
            })
        });
        rows.and_then(|r| r.collect::<rusqlite::Result<_>>())
            .map_err(sqlite_err(&self.dir))
    }

    /// Settles a release whose files are all planned (module docs): its duplicates, the older
    /// copies it supersedes or withdraws, its counts. One transaction: a kill before the commit
    /// leaves nothing of it, and the next plan runs it again.
    pub fn resolve_release(&mut self, release: i64) -> Result<ReleaseCounts> {
        let err = sqlite_err(&self.dir);
        let tx = self.conn.transaction().map_err(&err)?;
        resolve_duplicates(&tx, release).map_err(&err)?;
        let only_adds: bool = tx
            .query_row(
                "SELECT only_adds FROM releases WHERE id = ?1",
                [release],
                |r| r.get(0),
            )
            .optional()
            .map_err(&err)?
            .unwrap_or(false);
        let planned_now = format!(
            "SELECT p.id FROM papers p WHERE p.duplicate_of IS NULL AND {}",
            in_release("p.batch_id", "=")
        );
        tx.execute(
            &format!(
                "UPDATE papers SET superseded_in = ?1 WHERE {LIVE} AND {} AND id IN ({planned_now})",
                in_release("batch_id", "<")
            ),
            [release],
        )
        .map_err(&err)?;
        if !only_adds {
            tx.execute(
                &format!(
                    "UPDATE papers SET withdrawn_in = ?1 WHERE {LIVE} AND {}
                     AND id NOT IN ({planned_now})
                     AND id NOT IN (SELECT id FROM release_seen WHERE release = ?1)",
                    in_release("batch_id", "<")
                ),
                [release],
            )
            .map_err(&err)?;
        }
        // A restamped paper's live row now serves the release's metadata: the next release
        // compares with it.
        tx.execute(
            &format!(
                "UPDATE papers SET meta_hash = (SELECT s.meta_hash FROM release_seen s
                     WHERE s.release = ?1 AND s.id = papers.id AND s.duplicate_of IS NULL
                       AND s.meta_hash IS NOT NULL LIMIT 1)
                 WHERE {LIVE} AND {} AND id IN (SELECT id FROM release_seen WHERE release = ?1
                       AND duplicate_of IS NULL AND meta_hash IS NOT NULL)",
                in_release("batch_id", "<")
            ),
            [release],
        )
        .map_err(&err)?;
        let count =
            |sql: &str| -> rusqlite::Result<u64> { tx.query_row(sql, [release], |r| r.get(0)) };
        let planned: u64 = count(&format!("SELECT count(*) FROM ({planned_now})")).map_err(&err)?;
        // Counted from the marks, not from what this run marked: a release settled before
        // (its plan killed before it was complete) is settled again to the same counts.
        let changed =
            count("SELECT count(*) FROM papers WHERE superseded_in = ?1").map_err(&err)?;
        let withdrawn =
            count("SELECT count(*) FROM papers WHERE withdrawn_in = ?1").map_err(&err)?;
        let unchanged = count(
            "SELECT count(DISTINCT id) FROM release_seen WHERE release = ?1 AND duplicate_of IS NULL",
        )
        .map_err(&err)?;
        let restamped = count(
            "SELECT count(DISTINCT id) FROM release_seen WHERE release = ?1 AND duplicate_of IS NULL
             AND meta_hash IS NOT NULL",
        )
        .map_err(&err)?;
        let counts = ReleaseCounts {
            added: planned - changed,
            changed,
            withdrawn,
            unchanged,
            restamped,
        };
        tx.execute(
            "UPDATE releases SET planned_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
                 added = ?2, changed = ?3, withdrawn = ?4, unchanged = ?5, restamped = ?6
             WHERE id = ?1",
            params![
                release,
                counts.added,
                counts.changed,
                counts.withdrawn,
                counts.unchanged,
                counts.restamped
            ],
        )
        .map_err(&err)?;
        super::attempts::test_kill_point("resolve_duplicates");
        tx.commit().map_err(&err)?;
        Ok(counts)
    }
}

/// Marks every later occurrence of an id within `release` (file order, then line) as a
/// duplicate of the first and quarantines it: planned rows are excluded from their batch, rows
/// seen unchanged are only quarantined. Idempotent: an occurrence marked before is left.
fn resolve_duplicates(tx: &rusqlite::Transaction, release: i64) -> rusqlite::Result<()> {
    tx.execute_batch("CREATE INDEX IF NOT EXISTS papers_by_id ON papers (id)")?;
    // kind 0: a planned row (papers.rowid); kind 1: a row seen unchanged (release_seen.rowid).
    let occurrences: Vec<(i64, i64, String, i64, i64, String)> = {
        let mut stmt = tx.prepare(
            "WITH occ AS (
                 SELECT 0 AS kind, p.rowid AS rid, p.id AS id, coalesce(p.file_id, b.file_id) AS file_id,
                        p.line AS line
                 FROM papers p JOIN batches b ON b.id = p.batch_id JOIN corpus_files f ON f.id = b.file_id
                 WHERE f.release = ?1
                 UNION ALL
                 SELECT 1, s.rowid, s.id, s.file_id, s.line FROM release_seen s WHERE s.release = ?1)
             SELECT o.kind, o.rid, o.id, o.file_id, o.line, f.path FROM occ o
             JOIN corpus_files f ON f.id = o.file_id
             WHERE o.id IN (SELECT id FROM occ GROUP BY id HAVING count(*) > 1)
             ORDER BY o.id, o.file_id, o.line",
        )?;
        let rows = stmt.query_map([release], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let mut first: Option<(String, String)> = None; // (paper id, "file:line")
    for (kind, rid, id, file_id, line, path) in occurrences {
        let here = format!("{path}:{line}");
        match &first {
            Some((first_id, kept)) if *first_id == id => {
                let table = if kind == 0 { "papers" } else { "release_seen" };
                let marked = tx.execute(
                    &format!(
                        "UPDATE {table} SET duplicate_of = ?2 WHERE rowid = ?1 AND duplicate_of IS NULL"
                    ),
                    params![rid, kept],
                )?;
                if marked == 0 {
                    // Marked by an earlier run killed before the plan was complete: its
                    // exclusion and quarantine row are there already.
                    continue;
                }
                if kind == 0 {
                    tx.execute(
                        "UPDATE batches SET n_excluded = n_excluded + 1
                         WHERE id = (SELECT batch_id FROM papers WHERE rowid = ?1)",
                        [rid],
                    )?;
                }
                tx.execute(
                    "INSERT INTO quarantine (file_id, line, reason, detail, paper_id, first_occurrence)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![
                        file_id,
                        line,
                        QuarantineReason::DuplicateId.as_str(),
                        format!("id {id:?} was seen first at {kept}"),
                        id,
                        kept
                    ],
                )?;
            }
            _ => first = Some((id, here)),
        }
    }
    Ok(())
}
