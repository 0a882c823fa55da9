//! The run's shard keys: which it has (pinned, legacy, or pinned now), and each group's key
//! claimed for the run in the collection and made, placed on the cluster's peers in turn.

use embedfleet_core::rundb::RunDb;
use embedfleet_core::RunLayout;
use embedfleet_vectordb::shard_keys::{GroupCount, ShardKeys};
use embedfleet_vectordb::{CollectionSpec, KeyedShard, QdrantServer};

use super::groups::Group;
use super::options::LoadOptions;
use super::recover::Place;
use crate::SnapshotError;

/// The run's shard keys: a run loaded before groups (its load rows under `progress` name
/// `b<N>` keys and it pinned none) keeps its legacy key per batch; else the keys
/// [`ShardKeys::resolve`] decides: the pinned ones, or the group count asked for (else
/// [`GroupCount::BySize`] for the run's live papers) pinned now. A default count is said, with
/// why, when it is pinned.
pub(super) fn run_keys(
    db: &RunDb,
    layout: &RunLayout,
    progress: &str,
    options: &LoadOptions,
    peers: usize,
) -> Result<ShardKeys, SnapshotError> {
    let io = |e: std::io::Error| SnapshotError::Io {
        action: "read or pin",
        path: layout.shard_keys_file(),
        cause: e,
    };
    let pinned_before = ShardKeys::pinned(layout).map_err(io)?.is_some();
    if !pinned_before {
        let legacy_rows = db.snapshot_loads(progress)?;
        if !legacy_rows.is_empty()
            && legacy_rows
                .iter()
                .all(|r| ShardKeys::is_legacy_key(&r.shard_key))
        {
            eprintln!(
                "note: this run was loaded into this collection with a shard key per batch by an older embedfleet; it keeps them"
            );
            return Ok(ShardKeys::legacy());
        }
    }
    let wanted = match options.group_count {
        Some(groups) => GroupCount::Given(groups),
        // The whole run's papers, not the shards accepted so far: the keys are pinned for good.
        None => GroupCount::BySize {
            peers,
            points: db.status()?.papers_live,
        },
    };
    let resolved = ShardKeys::resolve(layout, db.last_batch_id()?, Some(wanted))
        .map_err(io)?
        .expect("a load always wants a grouping. This is a bug.");
    if let (GroupCount::BySize { peers, points }, false) = (wanted, pinned_before) {
        let (groups, why) = GroupCount::default_groups(peers, points);
        eprintln!("groups: {groups} ({why}; --group-count G to choose)");
    }
    if let Some(note) = &resolved.note {
        eprintln!("note: {note}");
    }
    Ok(resolved.keys)
}

/// Claims each group's key for the run in `name`'s metadata (another run's key is refused
/// unless `replace_keys`), then makes those the collection lacks: groups go round the peers,
/// group n's first replica on peer n mod P, the others on the peers after it (the server takes
/// a key's replicas from its placement). Returns where every key of the collection is.
pub(super) fn place_keys(
    server: &QdrantServer,
    at: &Place<'_>,
    spec: &CollectionSpec,
    keys: &ShardKeys,
    groups: &[Group],
    replace_keys: bool,
) -> Result<Vec<KeyedShard>, SnapshotError> {
    let (name, peers, run_dir) = (at.name, at.peers, at.layout.root());
    let existing_keys = server.keyed_shards(name)?;
    for g in groups {
        let owner = keys.owner_of_group(g.group, run_dir);
        server.claim_shard_key(name, &g.key, &owner, replace_keys)?;
    }
    for g in groups {
        if !existing_keys.iter().any(|s| s.key == g.key) {
            let replicas = spec.qdrant.replication_factor.unwrap_or(1).max(1) as usize;
            let placement: Vec<u64> = (0..replicas.min(peers.len()))
                .map(|i| {
                    let at = (g.group - 1 + i as i64).rem_euclid(peers.len() as i64);
                    peers[at as usize].id
                })
                .collect();
            server.create_shard_key(name, &g.key, &placement, spec.qdrant.replication_factor)?;
        }
    }
    Ok(server.keyed_shards(name)?)
}
