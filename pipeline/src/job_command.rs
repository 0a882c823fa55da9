//! The embed job's command line: what every embed job of a run is started with (the devices,
//! the model and the output options), resolved by `submit`'s settings, rendered as `embed-job`
//! flags into the job scripts, and parsed back by the job as its flags.

use std::path::PathBuf;

use embedfleet_core::handoff::OutputSettings;
use embedfleet_core::shardfile::VectorDtype;
use embedfleet_core::Precision;
use embedfleet_embed::job::DEFAULT_SHARD_PAPERS;
use embedfleet_models::TextRule;

/// How an embed job embeds: every `embed-job` flag but the run directory and the batch, which
/// the submit loop adds to each job's command line. The binary's `embed-job` parses what
/// [`JobSettings::to_args`] renders back into the same settings (its round-trip test).
#[derive(Debug, Clone, PartialEq)]
pub struct JobSettings {
    /// `cuda:0,1,2,3`, `cuda`, `cpu`, `cpu:N`.
    pub devices: String,
    /// Absolute: jobs start in the run directory.
    pub model_dir: PathBuf,
    pub dim: Option<usize>,
    pub vector_dtype: VectorDtype,
    pub precision: Precision,
    pub max_tokens: Option<usize>,
    pub shard_papers: usize,
    /// Mini-batches estimated above this many bytes fail as an out-of-memory would (tests).
    pub memory_limit: Option<u64>,
    /// Each job builds its batch's Qdrant shard after embedding it.
    pub build_shard: bool,
    /// How texts are prepared before they are tokenised; `None` for a run fixed before
    /// embedfleet recorded it (rendered as no flag, which the job reads so).
    pub text_rule: Option<TextRule>,
}

impl JobSettings {
    /// The flags that give these settings back when parsed: only what differs from a default,
    /// so job scripts stay short.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            "--model-dir".to_string(),
            self.model_dir.display().to_string(),
            "--devices".into(),
            self.devices.clone(),
        ];
        if self.shard_papers != DEFAULT_SHARD_PAPERS {
            args.extend(["--shard-papers".into(), self.shard_papers.to_string()]);
        }
        if let Some(dim) = self.dim {
            args.extend(["--dim".into(), dim.to_string()]);
        }
        if self.vector_dtype != VectorDtype::F32 {
            args.extend(["--vector-dtype".into(), "f16".into()]);
        }
        if self.precision != Precision::Native {
            args.extend(["--precision".into(), self.precision.name().into()]);
        }
        if let Some(max) = self.max_tokens {
            args.extend(["--max-tokens".into(), max.to_string()]);
        }
        if let Some(limit) = self.memory_limit {
            args.extend(["--memory-limit".into(), limit.to_string()]);
        }
        if self.build_shard {
            args.push("--build-shard".into());
        }
        if let Some(rule) = self.text_rule {
            args.extend(["--text-rule".into(), rule.name().into()]);
        }
        args
    }

    /// The output settings the jobs would pin (`output-settings.json`).
    pub fn output_settings(&self) -> OutputSettings {
        embedfleet_embed::job::output_settings(
            &self.model_dir,
            self.dim,
            self.vector_dtype,
            self.precision,
            self.max_tokens,
            self.shard_papers,
            self.text_rule,
        )
    }
}
