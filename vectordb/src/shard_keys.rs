//! Which shard key of a custom-sharded (snapshot-loaded) collection holds which batch, and which
//! run owns each key.
//!
//! A snapshot load builds one shard per *group* of consecutive batches and recovers it into the
//! group's shard key ([`ShardKeys`]). Every later write of a paper names its batch's group key,
//! so updates and deletes by id find the point. Keys are named after the run's identity
//! (`<run>-g<group>`), a random id made when the run's keys are first pinned and kept in
//! `snapshots/keys.json` beside its shards (not in run.db: a run.db rebuilt after a loss must
//! name the same keys, or a load would put every paper in twice). The collection records, in
//! its metadata, the run that owns each key ([`KeyOwner`]); a write or load refuses a key
//! another run owns, so two run directories loaded into one collection (a corpus update, the
//! second half of a corpus) add their keys side by side instead of replacing each other's.
//!
//! Runs loaded before groups existed have no `keys.json`: their keys are `b<batch>`, one per
//! batch ([`ShardKeys::legacy`]), and writes keep naming them so.

use std::path::Path;

use embedfleet_core::{pin, RunLayout};
use serde::{Deserialize, Serialize};

/// How a run's batches map to shard keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardKeys {
    /// The run's identity: 16 hex digits, random. Empty for a run's legacy `b<batch>` keys.
    pub run_id: String,
    /// Consecutive batches per group (one shard key each); 1 is a key per batch.
    pub batches_per_group: i64,
}

/// The metadata entry of a collection recording who owns shard key `key`.
pub fn owner_metadata_key(key: &str) -> String {
    format!("embedfleet_key:{key}")
}

/// The run that owns a shard key, as the collection's metadata records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyOwner {
    /// [`ShardKeys::run_id`] of the owning run.
    pub run: String,
    /// The owning run's directory, as its owner saw it (for the user: which run it is).
    pub dir: String,
    /// The batches of the group the key holds, first and last.
    pub batches: (i64, i64),
}

/// The most groups per peer of the cluster a snapshot load makes when the run pinned no keys
/// and no group count was given.
pub const DEFAULT_GROUPS_PER_PEER: i64 = 2;

/// The fewest points a group holds before the snapshot load's default gives it a shard key of
/// its own. Every search visits every key's graph, and a graph costs a search a fixed part
/// besides the part that grows with its points: measured (BENCHMARKS.md, "Snapshot loads in
/// groups"), groups of 100,000 points searched faster than one upserted collection of their
/// sum, groups of 50,000-60,000 at 1.06-1.29x its p50, groups of 20,000 at 1.22x and of 10,000
/// at 1.38x. So a collection under twice this is one group, which searches as an upserted one
/// does (0.89x at 40,000 points).
pub const MIN_POINTS_PER_GROUP: u64 = 100_000;

/// How a step wants the run's batches grouped when the run has pinned no keys yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupCount {
    /// `--group-count G` on the command line.
    Given(i64),
    /// The snapshot load's default for a collection of `points` on `peers` peers: see
    /// [`GroupCount::default_groups`].
    BySize { peers: usize, points: u64 },
    /// A key per batch: embed jobs that build their own batch's shard
    /// (`submit --build-shard`).
    PerBatch,
}

impl GroupCount {
    /// Batches per group over `batches` batches.
    pub fn batches_per_group(self, batches: i64) -> i64 {
        match self {
            Self::Given(groups) => ShardKeys::batches_per_group_for(batches, groups),
            Self::BySize { peers, points } => {
                ShardKeys::batches_per_group_for(batches, Self::default_groups(peers, points).0)
            }
            Self::PerBatch => 1,
        }
    }

    /// The snapshot load's group count for a collection of `points` on `peers` peers, and why:
    /// a group per [`MIN_POINTS_PER_GROUP`] points (one below that), never more than
    /// [`DEFAULT_GROUPS_PER_PEER`] per peer (more keys than that add graphs to every search
    /// and no parallelism to the recovery).
    pub fn default_groups(peers: usize, points: u64) -> (i64, String) {
        let most = DEFAULT_GROUPS_PER_PEER * peers.max(1) as i64;
        let by_size = (points / MIN_POINTS_PER_GROUP).max(1) as i64;
        let groups = by_size.min(most);
        let why = if by_size <= 1 {
            format!(
                "{points} points: groups of under {MIN_POINTS_PER_GROUP} search slower than one graph"
            )
        } else if groups == most {
            format!(
                "{points} points: {MIN_POINTS_PER_GROUP} or more a group, at most {DEFAULT_GROUPS_PER_PEER} per peer of {}",
                peers.max(1)
            )
        } else {
            format!("{points} points: {MIN_POINTS_PER_GROUP} or more a group")
        };
        (groups, why)
    }
}

/// The run's keys as [`ShardKeys::resolve`] found them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedKeys {
    pub keys: ShardKeys,
    /// Why a given group count was not applied (the keys were pinned another way).
    pub note: Option<String>,
}

/// The file in `snapshots/` that pins a run's keys.
const KEYS_FILE: &str = "keys.json";

impl ShardKeys {
    /// The keys of a run loaded before groups: `b<batch>`, a key per batch.
    pub fn legacy() -> Self {
        Self {
            run_id: String::new(),
            batches_per_group: 1,
        }
    }

    pub fn is_legacy(&self) -> bool {
        self.run_id.is_empty()
    }

    /// A key of the legacy form, `b<batch>` (a grouped key `<run id>-g<n>` may start with a
    /// `b` too: its run id is hex).
    pub fn is_legacy_key(key: &str) -> bool {
        key.strip_prefix('b')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
    }

    /// The group of `batch` (batches are numbered from 1; so are groups).
    pub fn group_of(&self, batch: i64) -> i64 {
        (batch - 1).max(0) / self.batches_per_group + 1
    }

    /// The first and last batch of `group`.
    pub fn batches_of(&self, group: i64) -> (i64, i64) {
        let first = (group - 1) * self.batches_per_group + 1;
        (first, first + self.batches_per_group - 1)
    }

    /// The shard key of `group`.
    pub fn key_of_group(&self, group: i64) -> String {
        if self.is_legacy() {
            format!("b{group}")
        } else {
            format!("{}-g{group}", self.run_id)
        }
    }

    /// The shard key holding `batch`.
    pub fn key_of(&self, batch: i64) -> String {
        self.key_of_group(self.group_of(batch))
    }

    /// The owner record of `group`'s key, for the run in `run_dir`.
    pub fn owner_of_group(&self, group: i64, run_dir: &Path) -> KeyOwner {
        KeyOwner {
            run: self.run_id.clone(),
            dir: std::path::absolute(run_dir)
                .unwrap_or_else(|_| run_dir.to_owned())
                .display()
                .to_string(),
            batches: self.batches_of(group),
        }
    }

    /// The run's pinned keys, `None` before any grouped build or load.
    pub fn pinned(layout: &RunLayout) -> std::io::Result<Option<Self>> {
        let path = layout.snapshot_dir().join(KEYS_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{} is not a shard-key pin: {e}", path.display()),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The keys writes to a custom-sharded collection name for this run: the pinned ones, or
    /// the legacy `b<batch>` keys of a run pinned none.
    pub fn for_writes(layout: &RunLayout) -> std::io::Result<Self> {
        Ok(Self::pinned(layout)?.unwrap_or_else(Self::legacy))
    }

    /// Pins `batches_per_group` for the run with a new identity, unless keys are pinned
    /// already: then those are returned, whatever was asked (the caller compares). Two
    /// processes pinning at once agree: the first writer wins ([`pin::write_once`]) and the
    /// other reads its keys.
    pub fn pin(layout: &RunLayout, batches_per_group: i64) -> std::io::Result<Self> {
        if let Some(pinned) = Self::pinned(layout)? {
            return Ok(pinned);
        }
        let keys = Self {
            run_id: format!("{:016x}", rand::random::<u64>()),
            batches_per_group: batches_per_group.max(1),
        };
        let dir = layout.snapshot_dir();
        std::fs::create_dir_all(&dir)?;
        let bytes = serde_json::to_vec_pretty(&keys).expect("plain data");
        pin::write_once(&dir.join(KEYS_FILE), &bytes)?;
        Ok(
            Self::pinned(layout)?
                .expect("the keys file is there: this process or another wrote it"),
        )
    }

    /// The run's keys, decided here for every step that needs them: the pinned ones, else
    /// `wanted` over the run's `batches` batches, pinned now. `None` when none are pinned and
    /// the step wants no particular grouping: the step asks the user for a group count. A
    /// count given on the command line that the pinned keys do not follow comes with a note.
    pub fn resolve(
        layout: &RunLayout,
        batches: i64,
        wanted: Option<GroupCount>,
    ) -> std::io::Result<Option<ResolvedKeys>> {
        let per_group = wanted.map(|w| w.batches_per_group(batches));
        if let Some(keys) = Self::pinned(layout)? {
            let note = match (wanted, per_group) {
                (Some(GroupCount::Given(g)), Some(per)) if per != keys.batches_per_group => Some(format!(
                    "this run's keys are pinned at {} batches per group (snapshots/keys.json), so --group-count {g} is not applied: a run's shards are grouped one way",
                    keys.batches_per_group
                )),
                _ => None,
            };
            return Ok(Some(ResolvedKeys { keys, note }));
        }
        let Some(per_group) = per_group else {
            return Ok(None);
        };
        Ok(Some(ResolvedKeys {
            keys: Self::pin(layout, per_group)?,
            note: None,
        }))
    }

    /// Batches per group for `groups` groups over `batches` batches (at least 1).
    pub fn batches_per_group_for(batches: i64, groups: i64) -> i64 {
        (batches.max(1) + groups.max(1) - 1) / groups.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_batches_share_a_group_key_named_after_the_run() {
        let keys = ShardKeys {
            run_id: "0123456789abcdef".into(),
            batches_per_group: 4,
        };
        assert_eq!(
            (1..=9).map(|b| keys.group_of(b)).collect::<Vec<_>>(),
            [1, 1, 1, 1, 2, 2, 2, 2, 3]
        );
        assert_eq!(keys.batches_of(2), (5, 8));
        assert_eq!(keys.key_of(6), "0123456789abcdef-g2");
        let legacy = ShardKeys::legacy();
        assert_eq!(legacy.key_of(6), "b6");
        assert_eq!(legacy.batches_of(6), (6, 6));
        assert!(ShardKeys::is_legacy_key("b6") && ShardKeys::is_legacy_key("b2075"));
        assert!(!ShardKeys::is_legacy_key("b3f0c9a1d2e4b5f6-g2"));
        assert!(!ShardKeys::is_legacy_key("b") && !ShardKeys::is_legacy_key("0123-g1"));
        assert_eq!(ShardKeys::batches_per_group_for(2075, 8), 260);
        assert_eq!(ShardKeys::batches_per_group_for(8, 8), 1);
        assert_eq!(ShardKeys::batches_per_group_for(3, 8), 1);
    }

    #[test]
    fn every_step_gets_its_keys_from_one_decision() {
        let dir = tempfile::tempdir().unwrap();
        let layout = RunLayout::new(dir.path());
        // Nothing pinned, nothing wanted: the step must ask the user.
        assert_eq!(ShardKeys::resolve(&layout, 2075, None).unwrap(), None);
        assert_eq!(GroupCount::Given(8).batches_per_group(2075), 260);
        let study = 8_300_000;
        assert_eq!(
            GroupCount::BySize {
                peers: 3,
                points: study
            }
            .batches_per_group(2075),
            346
        );
        assert_eq!(GroupCount::PerBatch.batches_per_group(2075), 1);
        let first = ShardKeys::resolve(
            &layout,
            2075,
            Some(GroupCount::BySize {
                peers: 4,
                points: study,
            }),
        )
        .unwrap()
        .unwrap();
        assert_eq!(first.keys.batches_per_group, 260);
        assert_eq!(first.note, None);
        // Pinned: every later step gets the same keys; a count given otherwise is noted.
        for wanted in [
            None,
            Some(GroupCount::PerBatch),
            Some(GroupCount::BySize {
                peers: 1,
                points: 40_000,
            }),
        ] {
            let again = ShardKeys::resolve(&layout, 2075, wanted).unwrap().unwrap();
            assert_eq!((again.keys.clone(), again.note), (first.keys.clone(), None));
        }
        let given = ShardKeys::resolve(&layout, 2075, Some(GroupCount::Given(4)))
            .unwrap()
            .unwrap();
        assert_eq!(given.keys, first.keys);
        assert!(
            given
                .note
                .as_deref()
                .is_some_and(|n| n.contains("--group-count 4 is not applied")),
            "{given:?}"
        );
        let same = ShardKeys::resolve(&layout, 2075, Some(GroupCount::Given(8))).unwrap();
        assert_eq!(
            same.unwrap().note,
            None,
            "260 per group is what 8 groups make"
        );
    }

    #[test]
    fn the_default_group_count_follows_the_collections_size_up_to_two_per_peer() {
        let g = |peers, points| GroupCount::default_groups(peers, points);
        // Under two groups' worth: one group, whatever the cluster (the 40,000-point shape
        // whose groups searched 1.22x-1.73x slower than upsert, and 120,000 points whose two
        // groups of 60,000 searched 1.29x slower by one measure).
        assert_eq!(g(1, 40_000).0, 1);
        assert_eq!(g(3, 40_000).0, 1);
        assert_eq!(g(3, 120_000).0, 1);
        assert_eq!(g(3, 199_999).0, 1);
        assert!(
            g(3, 40_000)
                .1
                .contains("groups of under 100000 search slower"),
            "{:?}",
            g(3, 40_000)
        );
        // Then a group per 100,000 points...
        assert_eq!(g(3, 200_000).0, 2);
        assert_eq!(g(3, 450_000).0, 4);
        assert!(g(3, 450_000).1.ends_with("100000 or more a group"));
        // ...up to two per peer: the study's 8.3 M points on three peers.
        assert_eq!(g(3, 8_300_000).0, 6);
        assert!(g(3, 8_300_000).1.contains("at most 2 per peer of 3"));
        assert_eq!(g(0, 8_300_000).0, 2, "no peer listed counts as one");
        // Every group the default makes holds at least MIN_POINTS_PER_GROUP, or is the only one.
        for points in [1, 99_999, 100_000, 200_001, 333_333, 8_300_000] {
            for peers in 1..=8 {
                let (groups, _) = g(peers, points);
                assert!(groups == 1 || points / groups as u64 >= MIN_POINTS_PER_GROUP);
                assert!(groups <= DEFAULT_GROUPS_PER_PEER * peers as i64);
            }
        }
    }

    #[test]
    fn the_first_pin_wins_and_later_pins_read_it() {
        let dir = tempfile::tempdir().unwrap();
        let layout = RunLayout::new(dir.path());
        assert_eq!(ShardKeys::pinned(&layout).unwrap(), None);
        assert!(ShardKeys::for_writes(&layout).unwrap().is_legacy());
        let first = ShardKeys::pin(&layout, 5).unwrap();
        assert_eq!(first.run_id.len(), 16);
        let again = ShardKeys::pin(&layout, 9).unwrap();
        assert_eq!(
            again, first,
            "pinned once: a later ask gets the pinned keys"
        );
        assert_eq!(ShardKeys::for_writes(&layout).unwrap(), first);

        // Many at once in a fresh run directory: one identity for all.
        let dir = tempfile::tempdir().unwrap();
        let layout = RunLayout::new(dir.path());
        let pins: Vec<ShardKeys> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let layout = &layout;
                    s.spawn(move || ShardKeys::pin(layout, 1 + i).unwrap())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(pins.iter().all(|p| *p == pins[0]), "{pins:?}");
    }
}
