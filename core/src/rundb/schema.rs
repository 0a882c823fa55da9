//! The run.db schema, as an ordered list of migrations. `PRAGMA user_version` holds how many
//! have been applied; a run directory made by any earlier embedfleet is brought up to date when
//! opened. Never edit a migration that has shipped: add the next one.

pub(super) const MIGRATIONS: &[&str] = &[
    V1, V2, V3, V4, V5, V6, V7, V8, V9, V10, V11, V12, V13, V14, V15,
];

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

/// v12: running counts of what `status` shows, kept by triggers in the transaction of each
/// change (`rundb::counts`), so that the submit loop's poll reads a few rows instead of
/// aggregating every batch, shard, job and attempt of the run. Each `tally_*` table holds one
/// group of a `status` aggregate: the batches by release and state (count, papers, chars), the
/// jobs of each batch's latest attempt by queue and state, the shards, the finished embed runs
/// by release, the ingested attempts by state, the quarantined papers by reason, the upload
/// rows by collection. A trigger keeps each in step with every writer (the loop, `queues set`,
/// an upload, the `sqlite3` command), and dies with its transaction: a kill leaves no count
/// behind its table. They are counted from the tables once here. A later migration that
/// rebuilds a counted table (its triggers go with it) creates them again and recounts.
const V12: &str = r#"
CREATE TABLE tally_batches (
    release INTEGER NOT NULL,            -- the release of the batch's corpus file (0: none)
    state   TEXT NOT NULL,
    batches INTEGER NOT NULL,
    papers  INTEGER NOT NULL,            -- n_rows - n_excluded
    chars   INTEGER NOT NULL,
    PRIMARY KEY (release, state)
) WITHOUT ROWID;
INSERT INTO tally_batches
    SELECT coalesce(f.release, 0), b.state, count(*), sum(b.n_rows - b.n_excluded), sum(b.n_chars)
    FROM batches b LEFT JOIN corpus_files f ON f.id = b.file_id GROUP BY 1, 2;
CREATE TRIGGER tally_batches_insert AFTER INSERT ON batches BEGIN
    INSERT INTO tally_batches
        VALUES (coalesce((SELECT release FROM corpus_files WHERE id = NEW.file_id), 0), NEW.state,
                1, NEW.n_rows - NEW.n_excluded, NEW.n_chars)
        ON CONFLICT (release, state) DO UPDATE SET batches = batches + excluded.batches,
            papers = papers + excluded.papers, chars = chars + excluded.chars;
END;
CREATE TRIGGER tally_batches_delete AFTER DELETE ON batches BEGIN
    INSERT INTO tally_batches
        VALUES (coalesce((SELECT release FROM corpus_files WHERE id = OLD.file_id), 0), OLD.state,
                -1, OLD.n_excluded - OLD.n_rows, -OLD.n_chars)
        ON CONFLICT (release, state) DO UPDATE SET batches = batches + excluded.batches,
            papers = papers + excluded.papers, chars = chars + excluded.chars;
END;
CREATE TRIGGER tally_batches_update
AFTER UPDATE OF file_id, state, n_rows, n_excluded, n_chars ON batches BEGIN
    INSERT INTO tally_batches
        VALUES (coalesce((SELECT release FROM corpus_files WHERE id = OLD.file_id), 0), OLD.state,
                -1, OLD.n_excluded - OLD.n_rows, -OLD.n_chars)
        ON CONFLICT (release, state) DO UPDATE SET batches = batches + excluded.batches,
            papers = papers + excluded.papers, chars = chars + excluded.chars;
    INSERT INTO tally_batches
        VALUES (coalesce((SELECT release FROM corpus_files WHERE id = NEW.file_id), 0), NEW.state,
                1, NEW.n_rows - NEW.n_excluded, NEW.n_chars)
        ON CONFLICT (release, state) DO UPDATE SET batches = batches + excluded.batches,
            papers = papers + excluded.papers, chars = chars + excluded.chars;
END;

-- Each batch counts the job rows of its latest attempt: a change to a batch's jobs takes the
-- batch's latest rows out before it (BEFORE) and puts them back after it (AFTER).
CREATE TABLE tally_jobs (
    queue TEXT NOT NULL,                 -- '-' for none
    state TEXT NOT NULL,
    jobs  INTEGER NOT NULL,
    PRIMARY KEY (queue, state)
) WITHOUT ROWID;
INSERT INTO tally_jobs
    SELECT coalesce(queue, '-'), state, count(*) FROM jobs j
    WHERE attempt = (SELECT max(attempt) FROM jobs WHERE batch_id = j.batch_id) GROUP BY 1, 2;
CREATE TRIGGER tally_jobs_before_insert BEFORE INSERT ON jobs BEGIN
    INSERT INTO tally_jobs
        SELECT coalesce(queue, '-'), state, -count(*) FROM jobs j
        WHERE batch_id = NEW.batch_id
          AND attempt = (SELECT max(attempt) FROM jobs WHERE batch_id = j.batch_id) GROUP BY 1, 2
        ON CONFLICT (queue, state) DO UPDATE SET jobs = jobs + excluded.jobs;
END;
CREATE TRIGGER tally_jobs_after_insert AFTER INSERT ON jobs BEGIN
    INSERT INTO tally_jobs
        SELECT coalesce(queue, '-'), state, count(*) FROM jobs j
        WHERE batch_id = NEW.batch_id
          AND attempt = (SELECT max(attempt) FROM jobs WHERE batch_id = j.batch_id) GROUP BY 1, 2
        ON CONFLICT (queue, state) DO UPDATE SET jobs = jobs + excluded.jobs;
END;
CREATE TRIGGER tally_jobs_before_update BEFORE UPDATE OF batch_id, attempt, queue, state ON jobs
BEGIN
    INSERT INTO tally_jobs
        SELECT coalesce(queue, '-'), state, -count(*) FROM jobs j
        WHERE batch_id IN (OLD.batch_id, NEW.batch_id)
          AND attempt = (SELECT max(attempt) FROM jobs WHERE batch_id = j.batch_id) GROUP BY 1, 2
        ON CONFLICT (queue, state) DO UPDATE SET jobs = jobs + excluded.jobs;
END;
CREATE TRIGGER tally_jobs_after_update AFTER UPDATE OF batch_id, attempt, queue, state ON jobs
BEGIN
    INSERT INTO tally_jobs
        SELECT coalesce(queue, '-'), state, count(*) FROM jobs j
        WHERE batch_id IN (OLD.batch_id, NEW.batch_id)
          AND attempt = (SELECT max(attempt) FROM jobs WHERE batch_id = j.batch_id) GROUP BY 1, 2
        ON CONFLICT (queue, state) DO UPDATE SET jobs = jobs + excluded.jobs;
END;
CREATE TRIGGER tally_jobs_before_delete BEFORE DELETE ON jobs BEGIN
    INSERT INTO tally_jobs
        SELECT coalesce(queue, '-'), state, -count(*) FROM jobs j
        WHERE batch_id = OLD.batch_id
          AND attempt = (SELECT max(attempt) FROM jobs WHERE batch_id = j.batch_id) GROUP BY 1, 2
        ON CONFLICT (queue, state) DO UPDATE SET jobs = jobs + excluded.jobs;
END;
CREATE TRIGGER tally_jobs_after_delete AFTER DELETE ON jobs BEGIN
    INSERT INTO tally_jobs
        SELECT coalesce(queue, '-'), state, count(*) FROM jobs j
        WHERE batch_id = OLD.batch_id
          AND attempt = (SELECT max(attempt) FROM jobs WHERE batch_id = j.batch_id) GROUP BY 1, 2
        ON CONFLICT (queue, state) DO UPDATE SET jobs = jobs + excluded.jobs;
END;

CREATE TABLE tally_shards (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    shards INTEGER NOT NULL,
    rows   INTEGER NOT NULL
);
INSERT INTO tally_shards SELECT 1, count(*), coalesce(sum(rows), 0) FROM shards;
CREATE TRIGGER tally_shards_insert AFTER INSERT ON shards BEGIN
    UPDATE tally_shards SET shards = shards + 1, rows = rows + NEW.rows;
END;
CREATE TRIGGER tally_shards_delete AFTER DELETE ON shards BEGIN
    UPDATE tally_shards SET shards = shards - 1, rows = rows - OLD.rows;
END;
CREATE TRIGGER tally_shards_update AFTER UPDATE OF rows ON shards BEGIN
    UPDATE tally_shards SET rows = rows - OLD.rows + NEW.rows;
END;

-- Finished (`done`) embed runs only, by the release of their batch's corpus file.
CREATE TABLE tally_runs (
    release INTEGER PRIMARY KEY,         -- 0: a run of a batch without a corpus file
    papers  INTEGER NOT NULL,
    tokens  INTEGER NOT NULL,
    seconds REAL NOT NULL                -- total_s
);
INSERT INTO tally_runs
    SELECT coalesce(f.release, 0), sum(coalesce(r.papers, 0)), sum(coalesce(r.tokens, 0)),
           sum(coalesce(r.total_s, 0.0))
    FROM batch_runs r LEFT JOIN batches b ON b.id = r.batch_id
    LEFT JOIN corpus_files f ON f.id = b.file_id
    WHERE r.state = 'done' GROUP BY 1;
CREATE TRIGGER tally_runs_insert AFTER INSERT ON batch_runs WHEN NEW.state = 'done' BEGIN
    INSERT INTO tally_runs
        VALUES (coalesce((SELECT f.release FROM batches b JOIN corpus_files f ON f.id = b.file_id
                          WHERE b.id = NEW.batch_id), 0),
                coalesce(NEW.papers, 0), coalesce(NEW.tokens, 0), coalesce(NEW.total_s, 0.0))
        ON CONFLICT (release) DO UPDATE SET papers = papers + excluded.papers,
            tokens = tokens + excluded.tokens, seconds = seconds + excluded.seconds;
END;
CREATE TRIGGER tally_runs_delete AFTER DELETE ON batch_runs WHEN OLD.state = 'done' BEGIN
    INSERT INTO tally_runs
        VALUES (coalesce((SELECT f.release FROM batches b JOIN corpus_files f ON f.id = b.file_id
                          WHERE b.id = OLD.batch_id), 0),
                -coalesce(OLD.papers, 0), -coalesce(OLD.tokens, 0), -coalesce(OLD.total_s, 0.0))
        ON CONFLICT (release) DO UPDATE SET papers = papers + excluded.papers,
            tokens = tokens + excluded.tokens, seconds = seconds + excluded.seconds;
END;
CREATE TRIGGER tally_runs_update
AFTER UPDATE OF batch_id, state, papers, tokens, total_s ON batch_runs
WHEN OLD.state = 'done' OR NEW.state = 'done' BEGIN
    INSERT INTO tally_runs
        SELECT coalesce((SELECT f.release FROM batches b JOIN corpus_files f ON f.id = b.file_id
                         WHERE b.id = OLD.batch_id), 0),
               -coalesce(OLD.papers, 0), -coalesce(OLD.tokens, 0), -coalesce(OLD.total_s, 0.0)
        WHERE OLD.state = 'done'
        ON CONFLICT (release) DO UPDATE SET papers = papers + excluded.papers,
            tokens = tokens + excluded.tokens, seconds = seconds + excluded.seconds;
    INSERT INTO tally_runs
        SELECT coalesce((SELECT f.release FROM batches b JOIN corpus_files f ON f.id = b.file_id
                         WHERE b.id = NEW.batch_id), 0),
               coalesce(NEW.papers, 0), coalesce(NEW.tokens, 0), coalesce(NEW.total_s, 0.0)
        WHERE NEW.state = 'done'
        ON CONFLICT (release) DO UPDATE SET papers = papers + excluded.papers,
            tokens = tokens + excluded.tokens, seconds = seconds + excluded.seconds;
END;
-- The span of the finished runs (the embed rate) by index: first start, last finish.
CREATE INDEX batch_runs_done_started ON batch_runs (started_at) WHERE state = 'done';
CREATE INDEX batch_runs_done_finished ON batch_runs (finished_at) WHERE state = 'done';

-- A corpus file moved to another release takes its batches and their runs along.
CREATE TRIGGER tally_file_release AFTER UPDATE OF release ON corpus_files
WHEN OLD.release IS NOT NEW.release BEGIN
    INSERT INTO tally_batches
        SELECT OLD.release, state, -count(*), -sum(n_rows - n_excluded), -sum(n_chars)
        FROM batches WHERE file_id = NEW.id GROUP BY 2
        ON CONFLICT (release, state) DO UPDATE SET batches = batches + excluded.batches,
            papers = papers + excluded.papers, chars = chars + excluded.chars;
    INSERT INTO tally_batches
        SELECT NEW.release, state, count(*), sum(n_rows - n_excluded), sum(n_chars)
        FROM batches WHERE file_id = NEW.id GROUP BY 2
        ON CONFLICT (release, state) DO UPDATE SET batches = batches + excluded.batches,
            papers = papers + excluded.papers, chars = chars + excluded.chars;
    INSERT INTO tally_runs
        SELECT OLD.release, -sum(coalesce(r.papers, 0)), -sum(coalesce(r.tokens, 0)),
               -sum(coalesce(r.total_s, 0.0))
        FROM batch_runs r JOIN batches b ON b.id = r.batch_id
        WHERE b.file_id = NEW.id AND r.state = 'done' HAVING count(*) > 0
        ON CONFLICT (release) DO UPDATE SET papers = papers + excluded.papers,
            tokens = tokens + excluded.tokens, seconds = seconds + excluded.seconds;
    INSERT INTO tally_runs
        SELECT NEW.release, sum(coalesce(r.papers, 0)), sum(coalesce(r.tokens, 0)),
               sum(coalesce(r.total_s, 0.0))
        FROM batch_runs r JOIN batches b ON b.id = r.batch_id
        WHERE b.file_id = NEW.id AND r.state = 'done' HAVING count(*) > 0
        ON CONFLICT (release) DO UPDATE SET papers = papers + excluded.papers,
            tokens = tokens + excluded.tokens, seconds = seconds + excluded.seconds;
END;

CREATE TABLE tally_attempts (
    state    TEXT PRIMARY KEY,
    attempts INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO tally_attempts SELECT state, count(*) FROM attempts GROUP BY 1;
CREATE TRIGGER tally_attempts_insert AFTER INSERT ON attempts BEGIN
    INSERT INTO tally_attempts VALUES (NEW.state, 1)
        ON CONFLICT (state) DO UPDATE SET attempts = attempts + 1;
END;
CREATE TRIGGER tally_attempts_delete AFTER DELETE ON attempts BEGIN
    UPDATE tally_attempts SET attempts = attempts - 1 WHERE state = OLD.state;
END;
CREATE TRIGGER tally_attempts_update AFTER UPDATE OF state ON attempts BEGIN
    UPDATE tally_attempts SET attempts = attempts - 1 WHERE state = OLD.state;
    INSERT INTO tally_attempts VALUES (NEW.state, 1)
        ON CONFLICT (state) DO UPDATE SET attempts = attempts + 1;
END;

CREATE TABLE tally_quarantine (
    reason TEXT PRIMARY KEY,
    papers INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO tally_quarantine SELECT reason, count(*) FROM quarantine GROUP BY 1;
CREATE TRIGGER tally_quarantine_insert AFTER INSERT ON quarantine BEGIN
    INSERT INTO tally_quarantine VALUES (NEW.reason, 1)
        ON CONFLICT (reason) DO UPDATE SET papers = papers + 1;
END;
CREATE TRIGGER tally_quarantine_delete AFTER DELETE ON quarantine BEGIN
    UPDATE tally_quarantine SET papers = papers - 1 WHERE reason = OLD.reason;
END;
CREATE TRIGGER tally_quarantine_update AFTER UPDATE OF reason ON quarantine BEGIN
    UPDATE tally_quarantine SET papers = papers - 1 WHERE reason = OLD.reason;
    INSERT INTO tally_quarantine VALUES (NEW.reason, 1)
        ON CONFLICT (reason) DO UPDATE SET papers = papers + 1;
END;

CREATE TABLE tally_uploads (
    collection TEXT PRIMARY KEY,         -- `name@target`, as `uploads`
    uploads    INTEGER NOT NULL,         -- rows of `uploads`: a collection with none is not shown
    acked      INTEGER NOT NULL,
    failed     INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO tally_uploads
    SELECT collection, count(*), sum(rows_acked), sum(failed_rows) FROM uploads GROUP BY 1;
CREATE TRIGGER tally_uploads_insert AFTER INSERT ON uploads BEGIN
    INSERT INTO tally_uploads VALUES (NEW.collection, 1, NEW.rows_acked, NEW.failed_rows)
        ON CONFLICT (collection) DO UPDATE SET uploads = uploads + 1,
            acked = acked + excluded.acked, failed = failed + excluded.failed;
END;
CREATE TRIGGER tally_uploads_delete AFTER DELETE ON uploads BEGIN
    UPDATE tally_uploads SET uploads = uploads - 1, acked = acked - OLD.rows_acked,
        failed = failed - OLD.failed_rows WHERE collection = OLD.collection;
END;
CREATE TRIGGER tally_uploads_update AFTER UPDATE OF collection, rows_acked, failed_rows ON uploads
BEGIN
    UPDATE tally_uploads SET uploads = uploads - 1, acked = acked - OLD.rows_acked,
        failed = failed - OLD.failed_rows WHERE collection = OLD.collection;
    INSERT INTO tally_uploads VALUES (NEW.collection, 1, NEW.rows_acked, NEW.failed_rows)
        ON CONFLICT (collection) DO UPDATE SET uploads = uploads + 1,
            acked = acked + excluded.acked, failed = failed + excluded.failed;
END;

-- What every poll looks up by index rather than by a pass over the run: the batches waiting
-- for a job (`batches_without_job`; the first few, in id order, through `batches_unsettled`),
-- and those whose results folder an ingest reads (not settled, or with an attempt's files
-- left: `attempts/open_work.rs`).
CREATE INDEX batches_by_state ON batches (state);
CREATE INDEX batches_unsettled ON batches (id) WHERE state != 'done' OR results_settled = 0;
CREATE INDEX attempts_uncleaned ON attempts (batch_id) WHERE cleaned = 0 AND state != 'accepted';
"#;

/// v13: corpus metadata that follows a release without the text changing. Each paper row gets
/// the hash of its metadata (`meta_hash`, `paper::meta_hash`); a paper a release carries with
/// the same text but other metadata is *restamped*: its `release_seen` row holds the new
/// metadata and its hash, and whether the payload part changed (`payload_changed`: the
/// collection's `source` or `year`). Settling the release moves the live row's `meta_hash` to
/// the new one, so the next release compares with it; `releases.restamped` counts them.
/// `papers.file_id`: the corpus file of a row in a batch that packs an update's papers from
/// several files (NULL: the batch's own `file_id`, as for every batch planned from one file).
const V13: &str = r#"
ALTER TABLE papers ADD COLUMN meta_hash INTEGER;
ALTER TABLE papers ADD COLUMN file_id INTEGER;
ALTER TABLE release_seen ADD COLUMN meta_hash INTEGER;
ALTER TABLE release_seen ADD COLUMN payload_changed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE release_seen ADD COLUMN source TEXT;
ALTER TABLE release_seen ADD COLUMN created TEXT;
ALTER TABLE release_seen ADD COLUMN added TEXT;
ALTER TABLE release_seen ADD COLUMN version TEXT;
ALTER TABLE release_seen ADD COLUMN extra TEXT;
ALTER TABLE releases ADD COLUMN restamped INTEGER;
CREATE INDEX release_seen_restamped ON release_seen (id, release) WHERE meta_hash IS NOT NULL;
CREATE INDEX release_seen_payload ON release_seen (id) WHERE payload_changed;
"#;

/// v14: `upload_releases`: per progress key (a collection at a target), the newest corpus
/// release the collection was brought up to: every shard's rows acknowledged, none failed, and
/// so (the upload's check deletes them) no point a release withdrew or a tombstone deleted.
/// `status` says from it whether a release's withdrawals reached the collection; `query` ties
/// its results to it.
const V14: &str = r#"
CREATE TABLE upload_releases (
    collection  TEXT PRIMARY KEY,
    release     INTEGER NOT NULL,
    recorded_at TEXT NOT NULL
);
"#;

/// v15: `corpus_files.sources`: the papers a planned file had by `source` (JSON, source ->
/// papers): the values `--filter source=…` can select, so a prefix (`s2orc`) resolves to the
/// run's sources under it (`s2orc/train`) and a filter that selects none says which there are.
/// NULL for files planned before: their values are not known.
///
/// `deletes_applied`: per progress key (a collection at a target), the newest tombstone (by
/// rowid: tombstones are only ever added) whose delete reached the collection, by a `delete`
/// to it or a complete upload (whose check deletes every tombstoned point). A paper deleted
/// from one database and not yet from another is said by `status` for that one.
const V15: &str = r#"
ALTER TABLE corpus_files ADD COLUMN sources TEXT;
CREATE TABLE deletes_applied (
    collection  TEXT PRIMARY KEY,
    through     INTEGER NOT NULL,
    recorded_at TEXT NOT NULL
);
"#;
