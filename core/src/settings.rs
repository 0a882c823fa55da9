//! The plan's settings, stored in run.db (`settings` key `plan`) so that every later step — the
//! embed job sizing its mini-batches above all — uses the rules the run was planned with.

use crate::pin::{Field, Pinned};
use serde::{Deserialize, Serialize};

/// Papers per per-node job (the study's ≈4,000).
pub const DEFAULT_PAPERS_PER_JOB: u64 = 4000;
/// Token budget of one mini-batch under the default rule.
pub const DEFAULT_BATCH_TOKENS: u64 = 32_768;
/// The study's mini-batch rule: at most this many characters ...
pub const STUDY_MAX_CHARS: u64 = 150_000;
/// ... and at most this many papers.
pub const STUDY_MAX_PAPERS: u32 = 8;

/// How one job's papers are cut into per-device mini-batches (one forward pass each).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum MiniBatchRule {
    /// The study's heuristic: papers in corpus order, a mini-batch closes before it would exceed
    /// `max_chars` characters or `max_papers` papers.
    Chars { max_chars: u64, max_papers: u32 },
    /// The default: papers sorted by token count, a mini-batch closes before its papers ×
    /// its longest paper's tokens would exceed `max_tokens` (what a padded forward would
    /// compute; our packed forward computes only the real tokens), so similar lengths share a
    /// forward pass.
    TokenBudget { max_tokens: u64 },
}

impl Default for MiniBatchRule {
    fn default() -> Self {
        MiniBatchRule::TokenBudget {
            max_tokens: DEFAULT_BATCH_TOKENS,
        }
    }
}

impl MiniBatchRule {
    /// The study's rule: ≤150,000 characters and ≤8 papers.
    pub const STUDY: MiniBatchRule = MiniBatchRule::Chars {
        max_chars: STUDY_MAX_CHARS,
        max_papers: STUDY_MAX_PAPERS,
    };
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanSettings {
    /// Papers per per-node job.
    pub papers_per_job: u64,
    /// Characters per per-node job, when set.
    pub max_job_chars: Option<u64>,
    pub sources: Vec<String>,
    pub keep_fields: Vec<String>,
    pub minibatch: MiniBatchRule,
}

impl Default for PlanSettings {
    fn default() -> Self {
        Self {
            papers_per_job: DEFAULT_PAPERS_PER_JOB,
            max_job_chars: None,
            sources: Vec::new(),
            keep_fields: Vec::new(),
            minibatch: MiniBatchRule::default(),
        }
    }
}

impl Pinned for PlanSettings {
    fn fields(&self) -> Vec<Field> {
        vec![
            Field::new("papers per job", self.papers_per_job),
            Field::new("max job chars", format!("{:?}", self.max_job_chars)),
            Field::new("sources", format!("{:?}", self.sources)),
            Field::new("kept fields", format!("{:?}", self.keep_fields)),
            Field::new("mini-batch rule", format!("{:?}", self.minibatch)),
        ]
    }
}
