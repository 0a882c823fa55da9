//! The run.db schema, as an ordered list of migrations. `PRAGMA user_version` holds how many
//! have been applied; a run directory made by any earlier embedfleet is brought up to date when
//! opened. Never edit a migration that has shipped: add the next one.

pub(super) const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7, V8, V9, V10, V11];

const V1: &str = r#"
CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL            -- JSON
);
CREATE TABLE corpus_files (
    id          INTEGER PRIMARY KEY,   -- corpus order: files are numbered as discovered
    path        TEXT NOT NULL UNIQUE,
    size        INTEGER NOT NULL,
    mtime_ns    INTEGER NOT NULL,
    edges       TEXT NOT NULL,         -- hash of the first and last MiB
    state       TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'planned')),
    papers      INTEGER,
    quarantined INTEGER,
    filtered    INTEGER,
    corrupt     TEXT                   -- where and why reading stopped, if it did
);
CREATE TABLE batches (
    id         INTEGER PRIMARY KEY,
    file_id    INTEGER NOT NULL REFERENCES corpus_files(id),
    seq        INTEGER NOT NULL,
    path       TEXT NOT NULL,           -- relative to the run directory
    n_rows     INTEGER NOT NULL,        -- rows in the batch file
    n_excluded INTEGER NOT NULL DEFAULT 0, -- rows that are later duplicates, not to embed
    n_chars    INTEGER NOT NULL,
    state      TEXT NOT NULL DEFAULT 'planned'
               CHECK (state IN ('planned', 'running', 'done', 'failed')),
    UNIQUE (file_id, seq)
);
CREATE TABLE papers (
    id           TEXT NOT NULL,
    batch_id     INTEGER NOT NULL,
    row          INTEGER NOT NULL,
    line         INTEGER NOT NULL,
    n_chars      INTEGER NOT NULL,
    duplicate_of TEXT                   -- 'file:line' of the occurrence kept, for skipped rows
);
CREATE TABLE quarantine (
    file_id          INTEGER NOT NULL,
    line             INTEGER NOT NULL,
    reason           TEXT NOT NULL,
    detail           TEXT NOT NULL,
    paper_id         TEXT,
    first_occurrence TEXT
);
CREATE INDEX quarantine_by_file ON quarantine (file_id);
CREATE TABLE queues (
    name TEXT PRIMARY KEY,
    cap  INTEGER NOT NULL CHECK (cap >= 0)
);
CREATE TABLE jobs (
    id           INTEGER PRIMARY KEY,
    batch_id     INTEGER NOT NULL REFERENCES batches(id),
    attempt      INTEGER NOT NULL,
    backend      TEXT NOT NULL,
    queue        TEXT,
    scheduler_id TEXT,
    state        TEXT NOT NULL,
    exit_reason  TEXT,
    submitted_at TEXT,
    started_at   TEXT,
    finished_at  TEXT
);
CREATE INDEX jobs_by_batch ON jobs (batch_id);
CREATE TABLE shards (
    id         INTEGER PRIMARY KEY,
    batch_id   INTEGER NOT NULL REFERENCES batches(id),
    part       INTEGER NOT NULL,
    path       TEXT NOT NULL,
    rows       INTEGER NOT NULL,
    sha256     TEXT NOT NULL,
    created_at TEXT NOT NULL,
    UNIQUE (batch_id, part)
);
CREATE TABLE uploads (
    shard_id    INTEGER NOT NULL REFERENCES shards(id),
    collection  TEXT NOT NULL,
    rows_acked  INTEGER NOT NULL,
    failed_rows INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (shard_id, collection)
);
"#;

/// v2: one row per embed-job run of a batch, with the study's timing breakdown.
const V2: &str = r#"
CREATE TABLE batch_runs (
    id                  INTEGER PRIMARY KEY,
    batch_id            INTEGER NOT NULL REFERENCES batches(id),
    started_at          TEXT NOT NULL,
    finished_at         TEXT,
    devices             TEXT NOT NULL,
    state               TEXT NOT NULL CHECK (state IN ('running', 'done', 'failed')),
    error               TEXT,
    model_load_s        REAL,
    io_s                REAL,
    tokenize_s          REAL,
    inference_s         REAL,
    total_s             REAL,
    papers              INTEGER,
    tokens              INTEGER,
    padding_tokens      INTEGER,
    fallback_split      INTEGER,
    fallback_sequential INTEGER,
    fallback_chunked    INTEGER,
    long_chunked        INTEGER,
    peak_memory_bytes   INTEGER
);
CREATE INDEX batch_runs_by_batch ON batch_runs (batch_id);
"#;

/// v3: what the submit loop needs to find its jobs again after a restart: the job name it
/// submitted under (also the key of a job spanning several batches), its script, log and
/// completion marker, and when a job was last seen in a state.
const V3: &str = r#"
ALTER TABLE jobs ADD COLUMN name TEXT;
ALTER TABLE jobs ADD COLUMN script TEXT;
ALTER TABLE jobs ADD COLUMN log TEXT;
ALTER TABLE jobs ADD COLUMN marker TEXT;
ALTER TABLE jobs ADD COLUMN updated_at TEXT;
CREATE INDEX jobs_by_state ON jobs (state);
CREATE INDEX jobs_by_name ON jobs (name);
"#;

/// v4: upload progress is keyed by collection *and target* (the `collection` column holds
/// `name@target`) and remembers the shard's sha256: older rows, keyed by the name alone and
/// without a sha256, no longer match anything, so their shards are sent again (same point ids:
/// no duplicates).
const V4: &str = r#"
ALTER TABLE uploads ADD COLUMN shard_sha256 TEXT;
"#;

/// v5: one row per embed-job attempt the owner has ingested from its result manifest
/// (`results/b<batch>/<attempt>.json`): the accepted one of each batch, and those discarded,
/// rejected, failed or abandoned, with why. `cleaned` says the attempt's files are gone.
const V5: &str = r#"
CREATE TABLE attempts (
    batch_id    INTEGER NOT NULL REFERENCES batches(id),
    token       TEXT NOT NULL,
    state       TEXT NOT NULL,
    job         TEXT,
    host        TEXT,
    reason      TEXT,
    cleaned     INTEGER NOT NULL DEFAULT 0,
    ingested_at TEXT NOT NULL,
    PRIMARY KEY (batch_id, token)
);
"#;

/// v6: a snapshot load's steps per batch (`upload --mode snapshot`): the collection at its
/// target (`name@target`, as `uploads`), the batch's shard key and the server's shard id for
/// it, the snapshot recovered (its sha256) and how far the batch got (`key`, `recovered`,
/// `verified`), so a killed load resumes without recovering a finished shard again.
const V6: &str = r#"
CREATE TABLE snapshot_loads (
    collection      TEXT NOT NULL,
    batch_id        INTEGER NOT NULL REFERENCES batches(id),
    shard_key       TEXT NOT NULL,
    shard_id        INTEGER,
    snapshot_sha256 TEXT,
    points          INTEGER,
    step            TEXT NOT NULL,
    updated_at      TEXT NOT NULL,
    PRIMARY KEY (collection, batch_id)
);
"#;

/// v7: papers deleted from the run (`embedfleet delete`), which no upload, built shard or
/// published dataset may bring back (`tombstones`, one row per paper, with the batch of its
/// embedded copy); the identity of each collection the run uploaded into (`upload_collections`,
/// keyed as `uploads` by `name@target`: the marker embedfleet generated and stored in the
/// collection), so a collection dropped and recreated, or another run's, is told from the one
/// the recorded progress is about.
const V7: &str = r#"
CREATE TABLE tombstones (
    paper_id   TEXT PRIMARY KEY,
    batch_id   INTEGER NOT NULL REFERENCES batches(id),
    deleted_at TEXT NOT NULL
);
CREATE INDEX tombstones_by_batch ON tombstones (batch_id);
CREATE TABLE upload_collections (
    collection  TEXT PRIMARY KEY,
    marker      TEXT NOT NULL,
    recorded_at TEXT NOT NULL
);
"#;

/// v8: the ingest's bookkeeping of what it could not take. `manifest_stamp` is the size and
/// mtime of a rejected attempt's manifest when it was rejected: a manifest rewritten since is
/// verified again. `papers_by_batch` serves the per-batch reads of the papers table (a batch's
/// ids at ingest, its excluded rows in `plan.json`) without a scan of every paper of the run.
const V8: &str = r#"
ALTER TABLE attempts ADD COLUMN manifest_stamp TEXT;
CREATE INDEX IF NOT EXISTS papers_by_batch ON papers (batch_id, row);
"#;

/// v9: corpus releases (`plan --update`). `releases` has a row per release planned into the run
/// (1: the first plan), with what it came to once planned. Each corpus file belongs to one
/// release: the table is rebuilt so that a path is unique per release, not in the run (a release
/// may reuse a directory name). Each paper row gets the xxh3 of its text (`text_hash`, what an
/// update compares) and, once a later release replaces its text or leaves it out, that
/// release's number (`superseded_in`, `withdrawn_in`): such a row is no longer served.
/// `release_seen` holds the papers a release carries unchanged (their embedded copy is an
/// older row), where they were seen, so duplicates and withdrawals are told within the release.
const V9: &str = r#"
CREATE TABLE corpus_files_v9 (
    id          INTEGER PRIMARY KEY,
    path        TEXT NOT NULL,
    size        INTEGER NOT NULL,
    mtime_ns    INTEGER NOT NULL,
    edges       TEXT NOT NULL,
    state       TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'planned')),
    papers      INTEGER,
    quarantined INTEGER,
    filtered    INTEGER,
    corrupt     TEXT,
    release     INTEGER NOT NULL DEFAULT 1,
    UNIQUE (release, path)
);
INSERT INTO corpus_files_v9 (id, path, size, mtime_ns, edges, state, papers, quarantined, filtered, corrupt)
    SELECT id, path, size, mtime_ns, edges, state, papers, quarantined, filtered, corrupt FROM corpus_files;
DROP TABLE corpus_files;
ALTER TABLE corpus_files_v9 RENAME TO corpus_files;
CREATE TABLE releases (
    id         INTEGER PRIMARY KEY,
    only_adds  INTEGER NOT NULL DEFAULT 0,   -- absence from the release withdraws nothing
    command    TEXT,
    started_at TEXT NOT NULL,
    planned_at TEXT,                         -- NULL while it is being planned
    added      INTEGER,
    changed    INTEGER,
    withdrawn  INTEGER,
    unchanged  INTEGER
);
INSERT INTO releases (id, started_at, planned_at, added, changed, withdrawn, unchanged)
    SELECT 1, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
           CASE WHEN planned THEN strftime('%Y-%m-%dT%H:%M:%fZ', 'now') END,
           CASE WHEN planned THEN (SELECT count(*) FROM papers WHERE duplicate_of IS NULL) END,
           CASE WHEN planned THEN 0 END, CASE WHEN planned THEN 0 END, CASE WHEN planned THEN 0 END
    FROM (SELECT EXISTS (SELECT 1 FROM settings WHERE key = 'plan_state' AND value = '"complete"') AS planned)
    WHERE EXISTS (SELECT 1 FROM corpus_files);
ALTER TABLE papers ADD COLUMN text_hash INTEGER;
ALTER TABLE papers ADD COLUMN superseded_in INTEGER;
ALTER TABLE papers ADD COLUMN withdrawn_in INTEGER;
CREATE INDEX papers_withheld ON papers (batch_id, id)
    WHERE superseded_in IS NOT NULL OR withdrawn_in IS NOT NULL;
CREATE TABLE release_seen (
    release      INTEGER NOT NULL,
    file_id      INTEGER NOT NULL,
    line         INTEGER NOT NULL,
    id           TEXT NOT NULL,
    duplicate_of TEXT
);
CREATE INDEX release_seen_by_id ON release_seen (release, id);
CREATE INDEX release_seen_by_file ON release_seen (file_id);
"#;

/// v10: `batches.results_settled`: the batch is done and its results folder was cleaned with no
/// job open, so a poll need not read its folder again (`RunDb::ingest_results` reads the open
/// work's folders only). A new job of the batch, or a change of its state, clears it.
const V10: &str = r#"
ALTER TABLE batches ADD COLUMN results_settled INTEGER NOT NULL DEFAULT 0;
"#;

/// v11: what the owner's report reads again each poll: the jobs changed and the attempts
/// ingested since its last read (`RunDb::job_attempts_since`), by index, not by a scan of every
/// job of the run; and the job each embed run was part of (`batch_runs.job`, the job's name, as
/// `attempts.job`), so an attempt's run is found by name (older rows: by batch and time).
const V11: &str = r#"
ALTER TABLE batch_runs ADD COLUMN job TEXT;
CREATE INDEX IF NOT EXISTS jobs_by_updated ON jobs (updated_at);
CREATE INDEX IF NOT EXISTS attempts_by_ingested ON attempts (ingested_at);
"#;
