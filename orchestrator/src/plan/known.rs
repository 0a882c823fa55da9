//! What an update compares each paper of the new release with: the run's live papers, as
//! (xxh3 of the id, xxh3 of the text) pairs, sorted.
//!
//! 16 bytes a paper: 8.3 M papers take 133 MB, shared by every planning thread. Two ids that
//! share a hash cost nothing but a paper embedded again: a paper is skipped only when an id
//! hash *and* its text hash match, and which papers are new, changed or withdrawn is settled
//! afterwards in run.db by the ids themselves.

use super::PlanError;
use embedfleet_core::batchfile;
use embedfleet_core::paper::text_hash;
use embedfleet_core::rundb::RunDb;
use std::collections::BTreeMap;
use std::path::Path;

pub(super) struct KnownPapers {
    /// (id hash, text hash), sorted.
    pairs: Vec<(u64, u64)>,
    /// Id hashes of the papers deleted from the run (`embedfleet delete`), sorted: a release
    /// carrying one again, whatever its text, plans nothing for it (a deleted paper stays
    /// deleted in every release).
    deleted: Vec<u64>,
}

fn id_hash(id: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(id.as_bytes())
}

impl KnownPapers {
    /// The live papers of the releases before `release`. Papers planned before text hashes
    /// were recorded get theirs now, from their batch files (once: they are stored).
    pub fn of(db: &mut RunDb, release: i64, run_dir: &Path) -> Result<Self, PlanError> {
        let papers = db.known_papers(release)?;
        let mut missing: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        for (i, p) in papers.iter().enumerate() {
            if p.text_hash.is_none() {
                missing.entry(p.batch_id).or_default().push(i);
            }
        }
        let mut hashes: Vec<Option<u64>> = papers.iter().map(|p| p.text_hash).collect();
        for (batch, indices) in missing {
            let row = db
                .batch(embedfleet_core::BatchId(batch))?
                .expect("a paper's batch is in run.db. This is a bug.");
            let path = run_dir.join(&row.path);
            let mut texts: Vec<u64> = Vec::new();
            batchfile::read(&path, |r| texts.push(text_hash(&r.paper.text))).map_err(|e| {
                PlanError::BatchFile {
                    path: path.clone(),
                    message: e.to_string(),
                }
            })?;
            let mut found = Vec::with_capacity(indices.len());
            for i in indices {
                let hash =
                    *texts
                        .get(papers[i].row as usize)
                        .ok_or_else(|| PlanError::BatchFile {
                            path: path.clone(),
                            message: format!("it has no row {}", papers[i].row),
                        })?;
                hashes[i] = Some(hash);
                found.push((batch, papers[i].row, hash));
            }
            db.record_text_hashes(&found)?;
        }
        let mut pairs: Vec<(u64, u64)> = papers
            .iter()
            .zip(hashes)
            .map(|(p, h)| (id_hash(&p.id), h.expect("every hash was filled above")))
            .collect();
        pairs.sort_unstable();
        let mut deleted: Vec<u64> = db
            .tombstones()?
            .iter()
            .map(|t| id_hash(&t.paper_id))
            .collect();
        deleted.sort_unstable();
        Ok(Self { pairs, deleted })
    }

    /// True when the run holds `id` with this very text (the release carries it unchanged), or
    /// deleted it.
    pub fn holds_unchanged(&self, id: &str, text_hash: u64) -> bool {
        let key = id_hash(id);
        if self.deleted.binary_search(&key).is_ok() {
            return true;
        }
        let first = self.pairs.partition_point(|&(k, _)| k < key);
        self.pairs[first..]
            .iter()
            .take_while(|&&(k, _)| k == key)
            .any(|&(_, h)| h == text_hash)
    }

    #[cfg(test)]
    pub fn from_pairs(papers: &[(&str, &str)]) -> Self {
        let mut pairs: Vec<(u64, u64)> = papers
            .iter()
            .map(|(id, text)| (id_hash(id), text_hash(text)))
            .collect();
        pairs.sort_unstable();
        Self {
            pairs,
            deleted: vec![id_hash("deleted")],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_a_paper_only_with_the_same_id_and_the_same_text() {
        let known = KnownPapers::from_pairs(&[("a", "alpha"), ("b", "beta"), ("c", "gamma")]);
        assert!(known.holds_unchanged("a", text_hash("alpha")));
        assert!(known.holds_unchanged("c", text_hash("gamma")));
        assert!(!known.holds_unchanged("a", text_hash("alpha, revised")));
        assert!(!known.holds_unchanged("d", text_hash("alpha")));
        assert!(!known.holds_unchanged("b", text_hash("alpha")));
        assert!(
            known.holds_unchanged("deleted", text_hash("any text")),
            "deleted stays deleted"
        );
    }
}
