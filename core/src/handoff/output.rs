//! `output-settings.json`: the settings that decide a batch's rows, fixed for the whole run.
//!
//! A batch resumed with another `--shard-papers` would skip papers or duplicate them; one made
//! with other weights, dimension or dtype would mix vectors that cannot be compared. So the
//! first attempt (or `submit`, before any job) writes these settings, and every later attempt
//! and every result the owner ingests must match them.

use super::{read_json, HandoffError};
use crate::pin::{self, Difference, Field, Pinned};
use crate::shardfile::VectorDtype;
use crate::Precision;
use crate::RunLayout;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputSettings {
    /// The model's fingerprint (config.json and the safetensors' sizes and headers).
    pub model: String,
    /// Where the model was when the settings were fixed (shown, not compared).
    pub model_dir: String,
    /// The vector dimension asked for (`None`: the model's own).
    pub dim: Option<usize>,
    pub vector_dtype: VectorDtype,
    /// How the model computes (`--precision`); runs fixed before it existed computed natively.
    #[serde(default)]
    pub precision: Precision,
    /// Longest sequence fed to the model (`None`: the model's context).
    pub max_tokens: Option<usize>,
    /// Papers per parquet shard.
    pub shard_papers: usize,
    pub pooling: String,
    pub normalized: bool,
    /// The prompt written before every paper's text (the model directory's document prompt,
    /// E5's `passage: `); `None` for none.
    pub instruction: Option<String>,
    /// How a text is prepared before it is tokenised (`--text-rule`: `as-given`, as
    /// sentence-transformers 5.4 and later; `stripped`, as 5.3 and earlier). `None`: a run fixed
    /// before embedfleet recorded it, whose texts are prepared as they were then (the encoder
    /// families' stripped, Qwen3's as given); left out of the file so that it reads as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_rule: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error(
        "this run's output settings were fixed by its first attempt ({path}) and these differ: {}; \
         use the run's settings, or plan into a new run directory",
        pin::join(differences)
    )]
    Differs {
        path: String,
        differences: Vec<Difference>,
    },
    #[error(transparent)]
    File(#[from] HandoffError),
}

impl Pinned for OutputSettings {
    fn fields(&self) -> Vec<Field> {
        let dim = self.dim.map_or("the model's own".into(), |d| d.to_string());
        let max = (self.max_tokens).map_or("the model's context".into(), |m| m.to_string());
        let instruction = self.instruction.clone().unwrap_or_else(|| "none".into());
        vec![
            // The fingerprint decides; the directory is only shown (one model reached by two
            // mount paths, /eagle and /lus/eagle, is the same model).
            Field::shown_as(
                "model",
                &self.model,
                format!("{} ({})", self.model, self.model_dir),
            ),
            Field::new("--dim", dim),
            Field::new(
                "--vector-dtype",
                format!("{:?}", self.vector_dtype).to_lowercase(),
            ),
            Field::new("--precision", self.precision.name()),
            Field::new("--max-tokens", max),
            Field::new("--shard-papers", self.shard_papers),
            Field::new("pooling", &self.pooling),
            Field::new("normalized", self.normalized),
            Field::new("document prompt", instruction),
            Field::new(
                "--text-rule",
                self.text_rule
                    .clone()
                    .unwrap_or_else(|| "the one before it was recorded".into()),
            ),
        ]
    }
}

impl OutputSettings {
    /// The run's settings, when fixed. Only a file that is not there means "not fixed yet":
    /// one that cannot be read is an error, never taken for no settings.
    pub fn read(layout: &RunLayout) -> Result<Option<Self>, HandoffError> {
        match read_json(&layout.output_settings_file()) {
            Err(HandoffError::Io { cause: source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                Ok(None)
            }
            read => read.map(Some),
        }
    }

    /// Fixes these settings for the run if none are yet (the first writer wins, also across
    /// hosts: the file appears by a hard link, which fails when it exists), else checks them
    /// against the run's.
    pub fn pin(&self, layout: &RunLayout) -> Result<(), PinError> {
        let path = layout.output_settings_file();
        let bytes = serde_json::to_vec_pretty(self).expect("settings serialise. This is a bug.");
        pin::write_once(&path, &bytes).map_err(|source| HandoffError::Io {
            action: "create",
            path: path.clone(),
            cause: source,
        })?;
        let run = Self::read(layout)?.ok_or_else(|| HandoffError::Io {
            action: "read",
            path: path.clone(),
            cause: std::io::ErrorKind::NotFound.into(),
        })?;
        let differences = run.differences(self);
        if differences.is_empty() {
            Ok(())
        } else {
            Err(PinError::Differs {
                path: path.display().to_string(),
                differences,
            })
        }
    }
}

impl OutputSettings {
    /// Replaces the run's settings with these. Only for settings no result was taken in with
    /// (the caller checks): a job still running with the old ones is refused at ingest.
    pub fn replace(&self, layout: &RunLayout) -> Result<(), HandoffError> {
        let path = layout.output_settings_file();
        let bytes = serde_json::to_vec_pretty(self).expect("settings serialise. This is a bug.");
        crate::atomic::write(&path, &bytes).map_err(|source| HandoffError::Io {
            action: "replace",
            path,
            cause: source,
        })
    }
}

/// Settings of a document embedding of `shard_papers` papers per shard, for the tests.
#[cfg(test)]
pub(crate) fn settings_for_tests(shard_papers: usize) -> OutputSettings {
    OutputSettings {
        model: "0123456789abcdef".into(),
        model_dir: "/models/q".into(),
        dim: None,
        vector_dtype: VectorDtype::F32,
        precision: Precision::Native,
        max_tokens: None,
        shard_papers,
        pooling: "last_token".into(),
        normalized: true,
        instruction: None,
        text_rule: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(shard_papers: usize) -> OutputSettings {
        settings_for_tests(shard_papers)
    }

    #[test]
    fn the_first_pin_wins_and_a_different_one_is_refused_naming_what_differs() {
        let dir = tempfile::tempdir().unwrap();
        let layout = RunLayout::new(dir.path());
        settings(500).pin(&layout).unwrap();
        settings(500).pin(&layout).unwrap();
        let mut other = settings(1000);
        other.model_dir = "/elsewhere".into(); // shown, not compared
        let err = other.pin(&layout).unwrap_err().to_string();
        assert!(
            err.contains("--shard-papers: the run's 500, here 1000"),
            "{err}"
        );
        assert!(!err.contains("--dim"), "{err}");
        assert_eq!(OutputSettings::read(&layout).unwrap(), Some(settings(500)));
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file is left");
    }

    #[test]
    fn fp8_vectors_never_join_a_run_pinned_to_native_ones() {
        let dir = tempfile::tempdir().unwrap();
        let layout = RunLayout::new(dir.path());
        settings(500).pin(&layout).unwrap();
        let mut fp8 = settings(500);
        fp8.precision = Precision::Fp8;
        let err = fp8.pin(&layout).unwrap_err().to_string();
        assert!(
            err.contains("--precision: the run's native, here fp8"),
            "{err}"
        );
    }

    #[test]
    fn a_run_pinned_before_precision_existed_reads_as_native() {
        let dir = tempfile::tempdir().unwrap();
        let layout = RunLayout::new(dir.path());
        let mut json = serde_json::to_value(settings(500)).unwrap();
        json.as_object_mut().unwrap().remove("precision");
        std::fs::write(layout.output_settings_file(), json.to_string()).unwrap();
        settings(500).pin(&layout).unwrap();
        let read = OutputSettings::read(&layout).unwrap().unwrap();
        assert_eq!(read.precision, Precision::Native);
    }

    #[test]
    fn racing_pins_leave_exactly_one_setting() {
        let dir = tempfile::tempdir().unwrap();
        let layout = RunLayout::new(dir.path());
        let results: Vec<bool> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let layout = layout.clone();
                    s.spawn(move || settings(100 + i % 2).pin(&layout).is_ok())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let won = OutputSettings::read(&layout).unwrap().unwrap().shard_papers;
        for (i, ok) in results.iter().enumerate() {
            assert_eq!(*ok, 100 + i % 2 == won, "thread {i}");
        }
    }
}
