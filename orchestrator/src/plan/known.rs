//! What an update compares each paper of the new release with: the run's live papers, as
//! (xxh3 of the id, xxh3 of the text, metadata hash) triples, sorted.
//!
//! 24 bytes a paper: 8.3 M papers take 200 MB, shared by every planning thread. Two ids that
//! share a hash cost nothing but a paper embedded again: a paper is skipped only when an id
//! hash *and* its text hash match, and which papers are new, changed or withdrawn is settled
//! afterwards in run.db by the ids themselves. A skipped paper whose metadata hash differs is
//! restamped: its new metadata is recorded, not embedded.

use super::PlanError;
use embedfleet_core::batchfile;
use embedfleet_core::paper::{meta_hash, payload_differs, text_hash};
use embedfleet_core::rundb::RunDb;
use std::collections::BTreeMap;
use std::path::Path;

/// How the run holds a paper the release carries with the same text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    /// The same metadata too (or the paper was deleted from the run): nothing to do.
    Same,
    /// Other metadata: the release's is recorded and served, the paper not embedded again.
    Restamped { payload_changed: bool },
}

pub(super) struct KnownPapers {
    /// (id hash, text hash, metadata hash), sorted.
    pairs: Vec<(u64, u64, u64)>,
    /// Id hashes of the papers deleted from the run (`embedfleet delete`), sorted: a release
    /// carrying one again, whatever its text, plans nothing for it (a deleted paper stays
    /// deleted in every release).
    deleted: Vec<u64>,
}

fn id_hash(id: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(id.as_bytes())
}

impl KnownPapers {
    /// The live papers of the releases before `release`. Papers planned before text or
    /// metadata hashes were recorded get theirs now, from their batch files (once: they are
    /// stored).
    pub fn of(db: &mut RunDb, release: i64, run_dir: &Path) -> Result<Self, PlanError> {
        let papers = db.known_papers(release)?;
        let mut missing: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        for (i, p) in papers.iter().enumerate() {
            if p.text_hash.is_none() || p.meta_hash.is_none() {
                missing.entry(p.batch_id).or_default().push(i);
            }
        }
        let mut hashes: Vec<Option<(u64, u64)>> = papers
            .iter()
            .map(|p| p.text_hash.zip(p.meta_hash))
            .collect();
        for (batch, indices) in missing {
            let row = db
                .batch(embedfleet_core::BatchId(batch))?
                .expect("a paper's batch is in run.db. This is a bug.");
            let path = run_dir.join(&row.path);
            let mut texts: Vec<(u64, u64)> = Vec::new();
            batchfile::read(&path, |r| {
                texts.push((text_hash(&r.paper.text), meta_hash(&r.paper)))
            })
            .map_err(|e| PlanError::BatchFile {
                path: path.clone(),
                message: e.to_string(),
            })?;
            let mut found = Vec::with_capacity(indices.len());
            for i in indices {
                let (text, meta) =
                    *texts
                        .get(papers[i].row as usize)
                        .ok_or_else(|| PlanError::BatchFile {
                            path: path.clone(),
                            message: format!("it has no row {}", papers[i].row),
                        })?;
                // A hash recorded already stays (a restamped row's is its release's).
                let (text, meta) = (
                    papers[i].text_hash.unwrap_or(text),
                    papers[i].meta_hash.unwrap_or(meta),
                );
                hashes[i] = Some((text, meta));
                found.push((batch, papers[i].row, text, meta));
            }
            db.record_hashes(&found)?;
        }
        let mut pairs: Vec<(u64, u64, u64)> = papers
            .iter()
            .zip(hashes)
            .map(|(p, h)| {
                let (text, meta) = h.expect("every hash was filled above");
                (id_hash(&p.id), text, meta)
            })
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

    /// What the run holds of `id` with this very text: `None` when it does not (the paper is
    /// to be embedded), else whether its metadata is the same.
    pub fn holds(&self, id: &str, text_hash: u64, meta_hash: u64) -> Option<Held> {
        let key = id_hash(id);
        if self.deleted.binary_search(&key).is_ok() {
            return Some(Held::Same);
        }
        let first = self.pairs.partition_point(|&(k, _, _)| k < key);
        let same_text = self.pairs[first..]
            .iter()
            .take_while(|&&(k, _, _)| k == key)
            .filter(|&&(_, h, _)| h == text_hash);
        let mut held = None;
        for &(_, _, meta) in same_text {
            if meta == meta_hash {
                return Some(Held::Same);
            }
            held = Some(Held::Restamped {
                payload_changed: payload_differs(meta, meta_hash),
            });
        }
        held
    }

    #[cfg(test)]
    pub fn from_pairs(papers: &[(&str, &str)]) -> Self {
        let mut pairs: Vec<(u64, u64, u64)> = papers
            .iter()
            .map(|(id, text)| (id_hash(id), text_hash(text), 7))
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
        let holds = |id, text| known.holds(id, text_hash(text), 7);
        assert_eq!(holds("a", "alpha"), Some(Held::Same));
        assert_eq!(holds("c", "gamma"), Some(Held::Same));
        assert_eq!(holds("a", "alpha, revised"), None);
        assert_eq!(holds("d", "alpha"), None);
        assert_eq!(holds("b", "alpha"), None);
        assert_eq!(
            holds("deleted", "any text"),
            Some(Held::Same),
            "deleted stays deleted"
        );
        // The same text with other metadata: restamped, the payload part told by the high half.
        assert_eq!(
            known.holds("a", text_hash("alpha"), 8),
            Some(Held::Restamped {
                payload_changed: false
            })
        );
        assert_eq!(
            known.holds("a", text_hash("alpha"), 7 | (1 << 40)),
            Some(Held::Restamped {
                payload_changed: true
            })
        );
    }
}
