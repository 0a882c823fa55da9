//! What a [`super::PgVector`] is told: the server, the index its tables get, how filtered
//! searches scan, the memory of an index build.

/// The index a table gets after its load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PgIndex {
    /// HNSW, with the spec's `m` and `ef_construct` (pgvector's `ef_construction`).
    #[default]
    Hnsw,
    /// IVFFlat, with lists from the row count.
    IvfFlat,
}

impl PgIndex {
    /// pgvector's access method.
    pub fn method(self) -> &'static str {
        match self {
            Self::Hnsw => "hnsw",
            Self::IvfFlat => "ivfflat",
        }
    }
}

/// How a filtered search scans the index (pgvector 0.8's `hnsw.iterative_scan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IterativeScan {
    /// Scan on until enough rows pass the filter, order nearly exact (then sorted again).
    #[default]
    Relaxed,
    /// Scan on, order exact (HNSW only; IVFFlat scans relaxed).
    Strict,
    /// pgvector's default: `ef_search` candidates, then the filter (short results).
    Off,
}

impl IterativeScan {
    /// The `hnsw.iterative_scan` value, `None` when off.
    pub(super) fn hnsw(self) -> Option<&'static str> {
        match self {
            Self::Relaxed => Some("relaxed_order"),
            Self::Strict => Some("strict_order"),
            Self::Off => None,
        }
    }
}

/// How to reach the server and what to build there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgConfig {
    /// `postgresql://user@host:port/database?sslmode=…` (no password: see the module docs).
    pub url: String,
    /// The index a table gets after its load.
    pub index: PgIndex,
    /// How filtered searches scan.
    pub iterative_scan: IterativeScan,
    /// Most `maintenance_work_mem` an index build asks for, in MB (`None`: half this machine's
    /// available memory when the server is on it, else 2,048).
    pub maintenance_mem_mb: Option<u64>,
    /// Parallel maintenance workers of an index build (`None`: the server's
    /// `max_parallel_workers`, at most this machine's cores less one when the server is on it).
    pub maintenance_workers: Option<u64>,
}

impl PgConfig {
    /// The server at `url`, HNSW, relaxed iterative scans, sized builds.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            index: PgIndex::Hnsw,
            iterative_scan: IterativeScan::Relaxed,
            maintenance_mem_mb: None,
            maintenance_workers: None,
        }
    }
}
