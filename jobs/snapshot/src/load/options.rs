//! What to load and how ([`LoadOptions`]), and what a load did ([`LoadReport`]).

use std::path::PathBuf;
use std::time::Duration;

use embedfleet_vectordb::CollectionSpec;

/// What to load and how.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub run_dir: PathBuf,
    /// The collection's name and settings (`vector_size` comes from the shards; sharding is
    /// custom whatever it says).
    pub spec: CollectionSpec,
    /// Snapshot recoveries at once (across the cluster's peers).
    pub in_flight: usize,
    /// Build here the groups no job built (else they are refused, listed).
    pub build_missing: bool,
    /// Exact searches checked after the load (spread over the groups).
    pub sample_searches: usize,
    /// How long to wait for the collection to become green.
    pub green_timeout: Duration,
    pub progress: bool,
    /// The group count: groups (shard keys) to split the run's batches into when the run has
    /// no keys pinned yet; `None`: the load's default
    /// ([`GroupCount::default_groups`](embedfleet_vectordb::shard_keys::GroupCount::default_groups):
    /// by the run's live papers, at most two per peer).
    pub group_count: Option<i64>,
    /// Take over shard keys the collection records as another run's (their points replaced).
    pub replace_keys: bool,
}

impl LoadOptions {
    pub fn new(run_dir: impl Into<PathBuf>, collection: impl Into<String>) -> Self {
        Self {
            run_dir: run_dir.into(),
            spec: CollectionSpec::new(collection, 0),
            in_flight: 4,
            build_missing: true,
            sample_searches: 50,
            green_timeout: Duration::from_secs(24 * 3600),
            progress: false,
            group_count: None,
            replace_keys: false,
        }
    }
}

/// What a load did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadReport {
    /// Batches of the run with accepted shards.
    pub batches: usize,
    /// Groups loaded (each one shard key).
    pub groups: usize,
    /// The run's keys: batches per group, and the run's identity naming them.
    pub batches_per_group: i64,
    pub run_id: String,
    /// Shards recovered by this load.
    pub recovered: usize,
    /// Groups a previous load had finished (resumed over).
    pub already: usize,
    /// Groups built here because no job had.
    pub built_here: usize,
    /// The collection was created by this load.
    pub created: bool,
    /// Points in this run's keys at the end (= the run's rows, less deleted papers).
    pub points: u64,
    /// Points in the whole collection (other runs' keys included).
    pub collection_points: u64,
    /// Seconds recovering, then until green.
    pub recover_s: f64,
    pub green_s: f64,
    /// Exact searches that found their own point first.
    pub searches_checked: usize,
    /// Points deleted by id after the recoveries: rows built shards hold that their groups no
    /// longer serve (deleted or withheld since the shard was built).
    pub deleted_after: u64,
}
