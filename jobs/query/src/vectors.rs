//! The query workload's cluster step: query vectors made by a scheduler job (`embedfleet
//! query-job`), handed to the run's owner as files.
//!
//! The owner (`query --submit`) writes the work into the run directory, `queries/<key>/`:
//! `work.json` (the model, dimension, instruction, part size, the terms' count and digest) and
//! `terms.json`; `<key>` is a digest of the work, so the same command finds its work again
//! and other terms or settings get their own folder. The job (on a GPU node) never opens
//! run.db: it reads those two files and embeds the terms in parts of
//! [`DEFAULT_PART_TERMS`], each written atomically as `vectors/part-NNNNNN.parquet` (`term`,
//! `vector`: fixed-size list of float32). A killed job keeps its finished parts and the next
//! one does only the rest. The owner collects the parts ([`QueryWorkDir::load_vectors`]) and
//! runs the searches with them ([`PrecomputedVectors`]): one writer of run.db and the output.
//!
//! Sized for the study's 22,723 terms: 12 parts of 2,048, so a kill loses at most one part
//! (about 2,048 × 4,096 × 4 bytes = 34 MB of vectors at the full dimension).

use crate::workload::{EmbedQueries, QueryError, QueryModel};
use arrow_array::builder::{FixedSizeListBuilder, Float32Builder, StringBuilder};
use arrow_array::{Array, ArrayRef, FixedSizeListArray, Float32Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use embedfleet_core::{atomic, Precision, RunLayout};
use embedfleet_models::TextRule;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Terms per part of a query job: the unit written at once, and lost at a kill.
pub const DEFAULT_PART_TERMS: usize = 2048;

/// What a query job embeds; `work.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueryWork {
    pub model_dir: PathBuf,
    pub dim: Option<usize>,
    pub instruction: String,
    pub part_terms: usize,
    pub terms: usize,
    /// xxh3 of the terms, each followed by a newline.
    pub terms_digest: String,
    /// The run's precision, which the job embeds at (left out when native, so that the work
    /// of a native run keeps the key it had before the field).
    #[serde(default, skip_serializing_if = "Precision::is_native")]
    pub precision: Precision,
    /// The run's text rule, by which the job prepares each term; `None` (left out, so that
    /// the work keeps the key it had before the field): a run fixed before embedfleet recorded
    /// it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_rule: Option<TextRule>,
}

impl QueryWork {
    pub fn new(
        model_dir: PathBuf,
        dim: Option<usize>,
        instruction: String,
        part_terms: usize,
        terms: &[String],
    ) -> Self {
        Self {
            model_dir,
            dim,
            instruction,
            part_terms: part_terms.max(1),
            terms: terms.len(),
            terms_digest: digest(terms),
            precision: Precision::Native,
            text_rule: Some(TextRule::default()),
        }
    }

    /// The work preparing terms by `rule` (the run's pinned one).
    pub fn with_text_rule(mut self, rule: Option<TextRule>) -> Self {
        self.text_rule = rule;
        self
    }

    /// The work embedding at `precision` (the run's pinned one).
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// The folder name of this work: 16 hex digits of its digest.
    pub fn key(&self) -> String {
        let json = serde_json::to_vec(self).expect("the work serialises. This is a bug.");
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&json))
    }

    pub fn parts(&self) -> usize {
        self.terms.div_ceil(self.part_terms)
    }
}

fn digest(terms: &[String]) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for t in terms {
        h.update(t.as_bytes());
        h.update(b"\n");
    }
    format!("{:016x}", h.digest())
}

#[derive(Debug, thiserror::Error)]
pub enum VectorsError {
    #[error("failed to {action} {}: {cause}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{} is not a query job's work: {why}", path.display())]
    BadWork { path: PathBuf, why: String },
    #[error(transparent)]
    Query(#[from] QueryError),
}

impl VectorsError {
    /// The query model was refused by this node's device (exit code 5).
    pub fn is_device_refusal(&self) -> bool {
        matches!(self, VectorsError::Query(e) if e.is_device_refusal())
    }
}

/// One query job's folder, `<run>/queries/<key>/`.
#[derive(Debug, Clone)]
pub struct QueryWorkDir {
    pub root: PathBuf,
    pub work: QueryWork,
    pub terms: Vec<String>,
}

impl QueryWorkDir {
    /// The owner's side: writes the work for `terms` (once; found again by its key).
    pub fn prepare(
        run_dir: &Path,
        work: QueryWork,
        terms: Vec<String>,
    ) -> Result<Self, VectorsError> {
        let root = RunLayout::new(run_dir).queries_dir().join(work.key());
        let vectors = root.join("vectors");
        std::fs::create_dir_all(&vectors).map_err(io("create", &vectors))?;
        for (name, bytes) in [
            ("terms.json", serde_json::to_vec(&terms)),
            ("work.json", serde_json::to_vec_pretty(&work)),
        ] {
            let path = root.join(name);
            if !path.is_file() {
                let bytes = bytes.expect("terms and work serialise. This is a bug.");
                atomic::write(&path, &bytes).map_err(io("write", &path))?;
            }
        }
        let dir = Self::open(&root)?;
        if dir.work != work || dir.terms != terms {
            return Err(VectorsError::BadWork {
                path: root,
                why: "its work.json or terms.json differ from the work its name stands for; remove the folder".into(),
            });
        }
        Ok(dir)
    }

    /// The job's side: reads the work of `root`.
    pub fn open(root: &Path) -> Result<Self, VectorsError> {
        let read = |name: &str| {
            let path = root.join(name);
            std::fs::read(&path).map_err(io("read", &path))
        };
        let bad = |why: String| VectorsError::BadWork {
            path: root.into(),
            why,
        };
        let work: QueryWork = serde_json::from_slice(&read("work.json")?)
            .map_err(|e| bad(format!("work.json: {e}")))?;
        let terms: Vec<String> = serde_json::from_slice(&read("terms.json")?)
            .map_err(|e| bad(format!("terms.json: {e}")))?;
        if terms.len() != work.terms || digest(&terms) != work.terms_digest {
            return Err(bad("terms.json does not match work.json".into()));
        }
        Ok(Self {
            root: root.into(),
            work,
            terms,
        })
    }

    pub fn part_path(&self, index: usize) -> PathBuf {
        self.root
            .join("vectors")
            .join(format!("part-{index:06}.parquet"))
    }

    fn part_terms(&self, index: usize) -> &[String] {
        let per = self.work.part_terms;
        let end = ((index + 1) * per).min(self.terms.len());
        &self.terms[index * per..end]
    }

    /// The parts not written yet.
    pub fn missing_parts(&self) -> Vec<usize> {
        (0..self.work.parts())
            .filter(|i| !self.part_path(*i).is_file())
            .collect()
    }

    /// Embeds the missing parts with `model`, each written atomically as soon as it is done;
    /// `on_part(index, parts)` after each. Returns how many parts this call wrote.
    pub fn embed_missing(
        &self,
        model: &mut QueryModel,
        mut on_part: impl FnMut(usize, usize),
    ) -> Result<usize, VectorsError> {
        let vectors = self.root.join("vectors");
        atomic::remove_leftovers(&vectors).map_err(io("clean", &vectors))?;
        let missing = self.missing_parts();
        for &index in &missing {
            let terms = self.part_terms(index);
            let embedded = model
                .embed(&self.work.instruction, terms)
                .map_err(QueryError::from)?;
            let path = self.part_path(index);
            write_part(&path, terms, &embedded).map_err(io("write", &path))?;
            on_part(index, self.work.parts());
            if let Some(ms) = std::env::var(crate::workload::TEST_DELAY_ENV)
                .ok()
                .and_then(|v| v.parse().ok())
            {
                std::thread::sleep(Duration::from_millis(ms));
            }
        }
        Ok(missing.len())
    }

    /// Every part's vectors, checked against the terms each part was for.
    pub fn load_vectors(&self) -> Result<PrecomputedVectors, VectorsError> {
        let mut by_term = HashMap::with_capacity(self.terms.len());
        for index in 0..self.work.parts() {
            let path = self.part_path(index);
            let (terms, vectors) = read_part(&path).map_err(io("read", &path))?;
            if terms != self.part_terms(index) {
                return Err(VectorsError::BadWork {
                    path,
                    why: "its terms are not the part's; remove the file and run again".into(),
                });
            }
            by_term.extend(terms.into_iter().zip(vectors));
        }
        Ok(PrecomputedVectors { by_term })
    }
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl Fn(std::io::Error) -> VectorsError + 'a {
    move |source| VectorsError::Io {
        action,
        path: path.into(),
        cause: source,
    }
}

/// Query vectors a job made, looked up by term: the searches of [`crate::workload::run`] then
/// need no model on the owner.
#[derive(Debug, Default)]
pub struct PrecomputedVectors {
    by_term: HashMap<String, Vec<f32>>,
}

impl EmbedQueries for PrecomputedVectors {
    fn embed_queries(
        &mut self,
        _instruction: &str,
        texts: &[String],
    ) -> Result<Vec<Vec<f32>>, QueryError> {
        texts
            .iter()
            .map(|t| {
                self.by_term
                    .get(t)
                    .cloned()
                    .ok_or_else(|| QueryError::NoVector { term: t.clone() })
            })
            .collect()
    }
}

fn schema(dim: usize) -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("term", DataType::Utf8, false),
        Field::new(
            "vector",
            DataType::FixedSizeList(
                Arc::new(Field::new("item", DataType::Float32, false)),
                dim as i32,
            ),
            false,
        ),
    ]))
}

fn write_part(path: &Path, terms: &[String], vectors: &[Vec<f32>]) -> std::io::Result<()> {
    let dim = vectors.first().map(Vec::len).unwrap_or(0);
    let mut term = StringBuilder::new();
    let mut vector = FixedSizeListBuilder::new(Float32Builder::new(), dim as i32)
        .with_field(Arc::new(Field::new("item", DataType::Float32, false)));
    for (t, v) in terms.iter().zip(vectors) {
        term.append_value(t);
        vector.values().append_slice(v);
        vector.append(true);
    }
    let columns: Vec<ArrayRef> = vec![Arc::new(term.finish()), Arc::new(vector.finish())];
    let batch = RecordBatch::try_new(schema(dim), columns).map_err(std::io::Error::other)?;
    atomic::or_discard(path, || {
        let mut writer = ArrowWriter::try_new(atomic::create_tmp(path)?, batch.schema(), None)
            .map_err(std::io::Error::other)?;
        writer.write(&batch).map_err(std::io::Error::other)?;
        writer.close().map_err(std::io::Error::other)?;
        atomic::commit(path)
    })
}

fn read_part(path: &Path) -> std::io::Result<(Vec<String>, Vec<Vec<f32>>)> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path)?)
        .map_err(std::io::Error::other)?
        .build()
        .map_err(std::io::Error::other)?;
    let (mut terms, mut vectors) = (Vec::new(), Vec::new());
    let bad = || std::io::Error::other("not a query vectors part (term, vector)");
    for batch in reader {
        let batch = batch.map_err(std::io::Error::other)?;
        let term = batch
            .column_by_name("term")
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .ok_or_else(bad)?;
        let vector = batch
            .column_by_name("vector")
            .and_then(|c| c.as_any().downcast_ref::<FixedSizeListArray>())
            .ok_or_else(bad)?;
        let values = vector
            .values()
            .as_any()
            .downcast_ref::<Float32Array>()
            .ok_or_else(bad)?;
        let dim = vector.value_length() as usize;
        for row in 0..batch.num_rows() {
            terms.push(term.value(row).to_string());
            let start = vector.value_offset(row) as usize;
            vectors.push(values.values()[start..start + dim].to_vec());
        }
    }
    Ok((terms, vectors))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_round_trip_and_are_checked_against_their_terms() {
        let dir = tempfile::tempdir().unwrap();
        let terms: Vec<String> = (0..5).map(|i| format!("term {i}")).collect();
        let work = QueryWork::new("/m".into(), None, "Find".into(), 2, &terms);
        assert_eq!(work.parts(), 3);
        let wd = QueryWorkDir::prepare(dir.path(), work.clone(), terms.clone()).unwrap();
        assert_eq!(wd.missing_parts(), vec![0, 1, 2]);
        // The same work is found again; other terms get another folder.
        let again = QueryWorkDir::prepare(dir.path(), work.clone(), terms.clone()).unwrap();
        assert_eq!(again.root, wd.root);
        let other = QueryWork::new("/m".into(), None, "Find".into(), 2, &terms[..4]);
        assert_ne!(other.key(), work.key());
        // A native run's work hashes as it did before the field; an FP8 run's is its own.
        let json = serde_json::to_string(&work).unwrap();
        assert!(!json.contains("precision"), "{json}");
        let fp8 = work.clone().with_precision(Precision::Fp8);
        assert_ne!(fp8.key(), work.key());
        let read: QueryWork = serde_json::from_str(&serde_json::to_string(&fp8).unwrap()).unwrap();
        assert_eq!(read.precision, Precision::Fp8);
        for i in 0..3 {
            let t = wd.part_terms(i);
            let v: Vec<Vec<f32>> = t.iter().map(|_| vec![i as f32, 1.0, 2.0]).collect();
            write_part(&wd.part_path(i), t, &v).unwrap();
        }
        assert!(wd.missing_parts().is_empty());
        let mut vectors = wd.load_vectors().unwrap();
        let got = vectors
            .embed_queries("Find", &["term 4".to_string(), "term 0".to_string()])
            .unwrap();
        assert_eq!(got, vec![vec![2.0, 1.0, 2.0], vec![0.0, 1.0, 2.0]]);
        assert!(vectors.embed_queries("Find", &["nope".into()]).is_err());
        // A part whose terms are not its own is refused.
        let swapped: Vec<String> = vec!["x".into(), "y".into()];
        write_part(&wd.part_path(0), &swapped, &[vec![0.0; 3], vec![0.0; 3]]).unwrap();
        assert!(matches!(
            wd.load_vectors(),
            Err(VectorsError::BadWork { .. })
        ));
    }
}
