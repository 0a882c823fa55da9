//! Step 2 of a load: the run's accepted parquet shards grouped by shard key, and each group's
//! built shard found (or built here), checked against the server's version and the
//! collection's settings, with the rows it holds that its group no longer serves.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use embedfleet_core::rundb::ShardRow;
use embedfleet_core::RunLayout;
use embedfleet_vectordb::integrity::Tombstones;
use embedfleet_vectordb::shard_keys::ShardKeys;
use embedfleet_vectordb::{shards, CollectionSpec};

use crate::build::{build_shard_without, describe_batches, find_usable, group_rows};
use crate::manifest::{BuiltShardManifest, SourceShard};
use crate::{check_engine_version, ShardSettings, SnapshotError};

/// One group to load.
pub(super) struct Group {
    /// Its number (groups are numbered from 1).
    pub group: i64,
    /// First and last batch of the group (its nominal range).
    pub batches: (i64, i64),
    pub key: String,
    pub manifest: BuiltShardManifest,
    /// Papers its built shard holds that the group no longer serves: deleted by id in its key
    /// after the recovery.
    pub extra: Vec<String>,
    /// Points its key holds at the end: the built shard's, less `extra`.
    pub points: u64,
}

/// The accepted shards of a group of the run, and the papers its shard leaves out (deleted)
/// or holds once for two rows (replaced).
pub(super) struct GroupSources {
    batches: (i64, i64),
    sources: Vec<SourceShard>,
    deleted: Vec<String>,
    replaced: Vec<String>,
}

/// The accepted parquet shards of each batch, in batch and part order.
pub(super) fn sources_by_batch(shards: &[ShardRow]) -> Vec<(i64, Vec<SourceShard>)> {
    let mut out: Vec<(i64, Vec<SourceShard>)> = Vec::new();
    for s in shards {
        let source = SourceShard::from(s);
        match out.last_mut() {
            Some((b, list)) if *b == s.batch_id.0 => list.push(source),
            _ => out.push((s.batch_id.0, vec![source])),
        }
    }
    out
}

/// The sources of each group of `keys`, by group number, with the papers each group no longer
/// serves.
pub(super) fn group_sources(
    keys: &ShardKeys,
    tombstones: &Tombstones,
    by_batch: &[(i64, Vec<SourceShard>)],
) -> BTreeMap<i64, GroupSources> {
    let mut by_group: BTreeMap<i64, GroupSources> = BTreeMap::new();
    for (batch, sources) in by_batch {
        let group = keys.group_of(*batch);
        let entry = by_group.entry(group).or_insert_with(|| {
            let batches = keys.batches_of(group);
            let (deleted, replaced) = group_rows(tombstones, |b| keys.group_of(b), batches);
            GroupSources {
                batches,
                sources: Vec::new(),
                deleted,
                replaced,
            }
        });
        entry.sources.extend(sources.iter().cloned());
    }
    by_group
}

/// Each group's built shard, of its accepted parquet shards less the papers it no longer
/// serves (a shard built before a delete or a release leaves out fewer: it is used, and the
/// rest deleted by id after its recovery). Groups no job built are built here, or refused
/// unless `build_missing`. Returns the groups and how many were built here.
pub(super) fn built_groups(
    layout: &RunLayout,
    keys: &ShardKeys,
    by_group: &BTreeMap<i64, GroupSources>,
    spec: &CollectionSpec,
    server_version: &str,
    build_missing: bool,
) -> Result<(Vec<Group>, usize), SnapshotError> {
    let found = by_group
        .values()
        .map(|g| find_usable(layout, g.batches, &g.sources, &g.deleted))
        .collect::<Result<Vec<_>, _>>()?;
    let missing: Vec<i64> = by_group
        .keys()
        .zip(&found)
        .filter(|(_, f)| f.is_none())
        .map(|(g, _)| *g)
        .collect();
    if !missing.is_empty() && !build_missing {
        return Err(SnapshotError::Sources {
            batch: keys.batches_of(missing[0]).0,
            message: format!(
                "{} groups have no built shard of their accepted parquet shards less their deleted papers ({}); run `embedfleet build-shard --accepted --group N` for them, or load without --no-build",
                missing.len(),
                list("group", &missing)
            ),
        });
    }
    if !missing.is_empty() {
        eprintln!(
            "building {} shards here that no job built ({}, {} batches per group)",
            missing.len(),
            list("group", &missing),
            keys.batches_per_group
        );
    }
    let wanted = ShardSettings::of(spec);
    let mut groups = Vec::with_capacity(by_group.len());
    let mut built_here = 0;
    for ((&group, g), found) in by_group.iter().zip(found) {
        let manifest = match found {
            Some(manifest) => manifest,
            None => {
                let (manifest, built) = build_group(layout, group, g, spec)?;
                built_here += usize::from(built);
                manifest
            }
        };
        check_engine_version(&manifest.engine_version, server_version)?;
        let differences = wanted.differences_from(&manifest.settings);
        if !differences.is_empty() {
            return Err(SnapshotError::SettingsDiffer {
                what: format!("the built shard of group {group} ({})", manifest.snapshot),
                differences,
            });
        }
        let (extra, points) = rows_to_delete(layout, &manifest, &g.deleted)?;
        groups.push(Group {
            group,
            batches: g.batches,
            key: keys.key_of_group(group),
            manifest,
            extra,
            points,
        });
    }
    Ok((groups, built_here))
}

/// Builds group `group`'s shard here; true when it was built now (not found finished).
fn build_group(
    layout: &RunLayout,
    group: i64,
    g: &GroupSources,
    spec: &CollectionSpec,
) -> Result<(BuiltShardManifest, bool), SnapshotError> {
    let outcome =
        build_shard_without(layout, g.batches, &g.sources, &g.deleted, &g.replaced, spec)?;
    if outcome.built {
        eprintln!(
            "  group {group} ({}): {} points built in {:.1} s ({:.1} CPU s)",
            describe_batches(g.batches),
            outcome.manifest.points,
            outcome.manifest.timings.total_s,
            outcome.manifest.timings.cpu_s
        );
    }
    Ok((outcome.manifest, outcome.built))
}

/// The papers `manifest`'s shard holds that its group no longer serves (in `deleted`, not left
/// out by the build), and the points its key holds once they are deleted. Reads the sources' id
/// column only when there are any.
fn rows_to_delete(
    layout: &RunLayout,
    manifest: &BuiltShardManifest,
    deleted: &[String],
) -> Result<(Vec<String>, u64), SnapshotError> {
    let left_out: HashSet<&str> = manifest.deleted.iter().map(String::as_str).collect();
    let extra: HashSet<&str> = deleted
        .iter()
        .map(String::as_str)
        .filter(|id| !left_out.contains(id))
        .collect();
    if extra.is_empty() {
        return Ok((Vec::new(), manifest.points));
    }
    let mut held = BTreeSet::new();
    for source in &manifest.sources {
        for id in shards::paper_ids(&layout.resolve(&source.file), source.rows)? {
            if extra.contains(id.as_str()) {
                held.insert(id);
            }
        }
    }
    let points = manifest.points.saturating_sub(held.len() as u64);
    Ok((held.into_iter().collect(), points))
}

fn list(what: &str, batches: &[i64]) -> String {
    let mut s: Vec<String> = batches.iter().take(8).map(|b| b.to_string()).collect();
    if batches.len() > 8 {
        s.push(format!("… {} more", batches.len() - 8));
    }
    format!("{what} {}", s.join(", "))
}
