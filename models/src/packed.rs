//! A mini-batch as a model takes it: sequences packed end to end (TEI's `Batch`), and the span
//! of each sequence inside the packed ids.

use crate::error::{ModelError, ModelResult};

/// Span of one sequence inside the packed batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqSpan {
    pub start: usize,
    pub len: usize,
}

/// A mini-batch's sequences packed end to end (TEI's `Batch`): `ids`, and `cu_seqlens` with
/// `cu_seqlens[0] == 0` and `cu_seqlens[i+1] - cu_seqlens[i]` the length of sequence `i`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackedSequences {
    pub ids: Vec<u32>,
    pub cu_seqlens: Vec<u32>,
}

impl PackedSequences {
    /// Packs sequences end to end.
    pub fn from_sequences<S: AsRef<[u32]>>(seqs: &[S]) -> PackedSequences {
        let mut batch = PackedSequences {
            ids: Vec::new(),
            cu_seqlens: vec![0],
        };
        for s in seqs {
            batch.push(s.as_ref());
        }
        batch
    }

    /// Appends one sequence.
    pub fn push(&mut self, seq: &[u32]) {
        if self.cu_seqlens.is_empty() {
            self.cu_seqlens.push(0);
        }
        self.ids.extend_from_slice(seq);
        self.cu_seqlens.push(self.ids.len() as u32);
    }

    /// Number of sequences.
    pub fn len(&self) -> usize {
        self.cu_seqlens.len().saturating_sub(1)
    }

    /// True when the batch holds no sequence.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks the batch and returns each sequence's span in `ids`.
    pub(crate) fn spans(&self, vocab_size: usize, max_len: usize) -> ModelResult<Vec<SeqSpan>> {
        let bad = |m: String| Err(ModelError::InvalidBatch(m));
        if self.cu_seqlens.is_empty() {
            return if self.ids.is_empty() {
                Ok(Vec::new())
            } else {
                bad("cu_seqlens is empty".into())
            };
        }
        if self.cu_seqlens[0] != 0 {
            return bad("cu_seqlens must start at 0".into());
        }
        if *self.cu_seqlens.last().unwrap_or(&0) as usize != self.ids.len() {
            return bad(format!(
                "cu_seqlens ends at {:?}, ids has {}",
                self.cu_seqlens.last(),
                self.ids.len()
            ));
        }
        let mut spans = Vec::with_capacity(self.len());
        for (index, w) in self.cu_seqlens.windows(2).enumerate() {
            if w[1] <= w[0] {
                return bad(format!("sequence {index} is empty or cu_seqlens decreases"));
            }
            let len = (w[1] - w[0]) as usize;
            if len > max_len {
                return Err(ModelError::SequenceTooLong {
                    index,
                    len,
                    max: max_len,
                });
            }
            spans.push(SeqSpan {
                start: w[0] as usize,
                len,
            });
        }
        if let Some(id) = self.ids.iter().find(|&&id| id as usize >= vocab_size) {
            return bad(format!(
                "token id {id} is not below vocab_size {vocab_size}"
            ));
        }
        Ok(spans)
    }
}
