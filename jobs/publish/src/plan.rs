//! How the shards' rows are split into data files. A pure function of the shards (their order,
//! row counts and checksums), the vector size, `--with-text` and the target size — so a killed
//! publish, run again, plans the same files and keeps the ones it finished.

use crate::run::Source;
use embedfleet_core::rundb::ShardRow;
use sha2::{Digest, Sha256};

/// Bytes a row carries besides its vector and text (id, counts, corpus metadata), roughly.
const ROW_OVERHEAD_BYTES: u64 = 64;
/// Bytes per parquet row group: small enough that a reader (the Hub's viewer, `datasets`)
/// never holds much of a 500 MB file at once, and the writer neither.
const ROW_GROUP_BYTES: u64 = 64 * 1024 * 1024;

/// Rows `from..from + rows` of one parquet shard, less `deleted`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    pub shard: ShardRow,
    pub from: u64,
    pub rows: u64,
    /// Rows of the shard in `from..from + rows` whose paper was deleted from the run (sorted):
    /// not written.
    pub deleted: Vec<u64>,
    /// Rows of the shard in the slice whose metadata a later release changed, with the new
    /// metadata's hash (sorted by row): written with the release's values.
    pub restamped: Vec<(u64, u64)>,
}

impl Slice {
    /// Rows written of this slice.
    pub fn kept(&self) -> u64 {
        self.rows - self.deleted.len() as u64
    }
}

/// One data file to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePlan {
    /// Relative to the folder: `data/train-00000-of-0000N.parquet`.
    pub path: String,
    pub rows: u64,
    pub slices: Vec<Slice>,
    /// What the file is made of (its slices, with the shards' checksums, and whether it has
    /// text), stored in its metadata: a file from a killed run is kept only when this matches.
    pub recipe_sha256: String,
}

/// The data files, and the parquet row-group size to write them with.
#[derive(Debug, Clone)]
pub struct Plan {
    pub files: Vec<FilePlan>,
    pub rows_per_group: usize,
}

/// Estimated bytes of one output row.
pub fn bytes_per_row(source: &Source, with_text: bool) -> u64 {
    let text = if with_text { source.text_bytes } else { 0 };
    (source.dim * source.item_bytes) as u64 + ROW_OVERHEAD_BYTES + text
}

/// Splits the shards' rows, in order, into files of `max(1, target / bytes per row)` rows,
/// each release's apart: release 1's are `data/train-NNNNN-of-MMMMM.parquet`, a later
/// release R's `data/train-rRRRR-NNNNN-of-MMMMM.parquet`.
pub fn split(source: &Source, with_text: bool, target_bytes: u64) -> Plan {
    let per_row = bytes_per_row(source, with_text).max(1);
    let rows_per_file = (target_bytes / per_row).max(1);
    let mut files = Vec::new();
    let mut first = 0;
    while first < source.shards.len() {
        let release = source.releases[first];
        let end = first
            + source.releases[first..]
                .iter()
                .take_while(|&&r| r == release)
                .count();
        let (shards, deleted) = (&source.shards[first..end], &source.deleted[first..end]);
        let restamped = source.restamped.get(first..end).unwrap_or(&[]);
        let total: u64 = shards.iter().map(|s| s.rows).sum();
        let n_files = total.div_ceil(rows_per_file).max(1);
        for i in 0..n_files {
            let start = i * rows_per_file;
            let rows = rows_per_file.min(total - start.min(total));
            let slices = slices(shards, deleted, restamped, start, rows);
            files.push(FilePlan {
                path: file_name(release, i, n_files),
                rows: slices.iter().map(Slice::kept).sum(),
                recipe_sha256: recipe(&slices, with_text),
                slices,
            });
        }
        first = end;
    }
    let rows_per_group = (ROW_GROUP_BYTES / per_row).clamp(1, 1 << 20) as usize;
    Plan {
        files,
        rows_per_group,
    }
}

fn file_name(release: i64, i: u64, n_files: u64) -> String {
    match release {
        1 => format!("data/train-{i:05}-of-{n_files:05}.parquet"),
        r => format!("data/train-r{r:04}-{i:05}-of-{n_files:05}.parquet"),
    }
}

/// The pieces of shards that make rows `start..start + rows` of the run, in order, each with
/// its deleted and restamped rows (`deleted`, `restamped`: per shard, as [`Source::deleted`]
/// and [`Source::restamped`]).
fn slices(
    shards: &[ShardRow],
    deleted: &[Vec<u64>],
    restamped: &[Vec<(u64, u64)>],
    start: u64,
    rows: u64,
) -> Vec<Slice> {
    let (mut out, mut offset) = (Vec::new(), 0u64);
    let end = start + rows;
    for (i, shard) in shards.iter().enumerate() {
        let (lo, hi) = (offset, offset + shard.rows);
        if hi > start && lo < end {
            let from = start.max(lo) - lo;
            let rows = end.min(hi) - lo - from;
            let dead = deleted.get(i).map_or(&[][..], Vec::as_slice);
            let new = restamped.get(i).map_or(&[][..], Vec::as_slice);
            out.push(Slice {
                shard: shard.clone(),
                from,
                rows,
                deleted: dead
                    .iter()
                    .copied()
                    .filter(|r| (from..from + rows).contains(r))
                    .collect(),
                restamped: new
                    .iter()
                    .filter(|(r, _)| (from..from + rows).contains(r))
                    .cloned()
                    .collect(),
            });
        }
        offset = hi;
        if offset >= end {
            break;
        }
    }
    out
}

fn recipe(slices: &[Slice], with_text: bool) -> String {
    let mut hasher = Sha256::new();
    hasher.update(if with_text { b"text\n" } else { b"vecs\n" });
    for s in slices {
        let line = format!(
            "{}\t{}\t{}\t{}\n",
            s.shard.path, s.shard.sha256, s.from, s.rows
        );
        hasher.update(line.as_bytes());
        // Only when some are: a run with no deletes keeps the recipes (and files) it had.
        if !s.deleted.is_empty() {
            let rows: Vec<String> = s.deleted.iter().map(u64::to_string).collect();
            hasher.update(format!("deleted\t{}\n", rows.join(",")).as_bytes());
        }
        // Likewise: a file takes a new recipe only when a release gave one of its rows new
        // metadata.
        for (row, meta_hash) in &s.restamped {
            hasher.update(format!("restamped\t{row}\t{meta_hash:016x}\n").as_bytes());
        }
    }
    format!("{:x}", hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use embedfleet_core::BatchId;

    fn source(rows: &[u64]) -> Source {
        let shards = rows
            .iter()
            .enumerate()
            .map(|(i, &rows)| ShardRow {
                batch_id: BatchId(1),
                part: i as u32,
                path: format!("shards/b000001-{i:04}.parquet"),
                rows,
                sha256: format!("{i}"),
            })
            .collect();
        Source {
            shards,
            schema: embedfleet_core::shardfile::schema(8, Default::default()),
            meta: Vec::new(),
            dim: 8,
            item_bytes: 4,
            text_bytes: 1000,
            plan_sha256: String::new(),
            deleted: vec![Vec::new(); rows.len()],
            withheld: 0,
            restamped: vec![Vec::new(); rows.len()],
            releases: vec![1; rows.len()],
        }
    }

    #[test]
    fn rows_are_cut_across_shards_in_order_and_every_row_is_in_one_file() {
        let source = source(&[10, 3, 7]);
        // 8 * 4 + 64 = 96 bytes a row: 6 rows a file.
        let plan = split(&source, false, 6 * 96);
        let rows: Vec<u64> = plan.files.iter().map(|f| f.rows).collect();
        assert_eq!(rows, [6, 6, 6, 2]);
        assert_eq!(plan.files[3].path, "data/train-00003-of-00004.parquet");
        let second: Vec<(u32, u64, u64)> = plan.files[1]
            .slices
            .iter()
            .map(|s| (s.shard.part, s.from, s.rows))
            .collect();
        assert_eq!(second, [(0, 6, 4), (1, 0, 2)]);
        let third: Vec<(u32, u64, u64)> = plan.files[2]
            .slices
            .iter()
            .map(|s| (s.shard.part, s.from, s.rows))
            .collect();
        assert_eq!(third, [(1, 2, 1), (2, 0, 5)]);
    }

    #[test]
    fn text_makes_rows_bigger_and_the_recipe_differ() {
        let source = source(&[100]);
        let plain = split(&source, false, 10_000);
        let text = split(&source, true, 10_000);
        assert!(text.files.len() > plain.files.len());
        assert_ne!(
            plain.files[0].recipe_sha256,
            split(&source, true, 10_000_000).files[0].recipe_sha256
        );
    }

    #[test]
    fn deleted_rows_leave_their_file_and_change_its_recipe_only() {
        let mut source = source(&[10, 3, 7]);
        let before = split(&source, false, 6 * 96);
        source.deleted[0] = vec![2, 7];
        let plan = split(&source, false, 6 * 96);
        let rows: Vec<u64> = plan.files.iter().map(|f| f.rows).collect();
        assert_eq!(
            rows,
            [5, 5, 6, 2],
            "row 2 in the first file, row 7 in the second"
        );
        assert_eq!(plan.files[1].slices[0].deleted, [7]);
        for (i, (a, b)) in before.files.iter().zip(&plan.files).enumerate() {
            assert_eq!(a.recipe_sha256 == b.recipe_sha256, i >= 2, "file {i}");
        }
    }

    #[test]
    fn each_release_has_files_of_its_own_and_a_later_one_leaves_the_earlier_files_alone() {
        let first = source(&[10, 3]);
        let before = split(&first, false, 6 * 96);
        let mut both = source(&[10, 3, 7, 2]);
        both.releases = vec![1, 1, 2, 2];
        let plan = split(&both, false, 6 * 96);
        let names: Vec<&str> = plan.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            names,
            [
                "data/train-00000-of-00003.parquet",
                "data/train-00001-of-00003.parquet",
                "data/train-00002-of-00003.parquet",
                "data/train-r0002-00000-of-00002.parquet",
                "data/train-r0002-00001-of-00002.parquet",
            ]
        );
        assert_eq!(
            plan.files.iter().map(|f| f.rows).collect::<Vec<_>>(),
            [6, 6, 1, 6, 3]
        );
        for (a, b) in before.files.iter().zip(&plan.files) {
            assert_eq!((&a.path, &a.recipe_sha256), (&b.path, &b.recipe_sha256));
        }
        let third: Vec<(u32, u64, u64)> = plan.files[3]
            .slices
            .iter()
            .map(|s| (s.shard.part, s.from, s.rows))
            .collect();
        assert_eq!(
            third,
            [(2, 0, 6)],
            "release 2's rows start a file of their own"
        );
    }

    #[test]
    fn new_metadata_changes_the_recipe_of_its_rows_file_only() {
        let mut source = source(&[10, 3, 7]);
        let before = split(&source, false, 6 * 96);
        let stamped = 0x5eed;
        source.restamped[1] = vec![(2, stamped)];
        let plan = split(&source, false, 6 * 96);
        // Shard 1's row 2 is row 12 of the run: the third file.
        assert_eq!(plan.files[2].slices[0].restamped, [(2, stamped)]);
        for (i, (a, b)) in before.files.iter().zip(&plan.files).enumerate() {
            assert_eq!(a.rows, b.rows);
            assert_eq!(a.recipe_sha256 == b.recipe_sha256, i != 2, "file {i}");
        }
    }

    #[test]
    fn a_tiny_target_still_puts_one_row_in_a_file() {
        let plan = split(&source(&[3]), false, 1);
        assert_eq!(plan.files.len(), 3);
        assert_eq!(plan.rows_per_group, (ROW_GROUP_BYTES / 96) as usize);
    }
}
