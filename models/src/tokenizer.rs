//! The Qwen3 tokenizer as the embedding model uses it.
//!
//! Qwen3-Embedding pools the hidden state of an appended `<|endoftext|>`, so every encoding
//! ends with that id. Texts are never truncated: a paper longer than the model's context is
//! the caller's to split into chunks. Queries carry an instruction
//! (`Instruct: {task}\nQuery:{text}`); documents carry none.

use std::path::{Path, PathBuf};

use crate::error::{ModelError, ModelResult};

/// The end-of-text token appended to every input.
pub const EOS_TOKEN: &str = "<|endoftext|>";

/// `tokenizer.json` loaded with the `tokenizers` crate, plus the EOS id.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos_id: u32,
    path: PathBuf,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .field("eos_id", &self.eos_id)
            .finish()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json`; fails if it has no `<|endoftext|>` token.
    pub fn from_file(path: &Path) -> ModelResult<Tokenizer> {
        if !path.is_file() {
            return Err(ModelError::MissingFile {
                path: path.to_path_buf(),
                hint: "the model directory needs the tokenizer.json shipped with the model",
            });
        }
        let mut inner =
            tokenizers::Tokenizer::from_file(path).map_err(|e| ModelError::Tokenizer {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
        inner
            .with_truncation(None)
            .map_err(|e| ModelError::Tokenizer {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
        inner.with_padding(None);
        let eos_id = inner
            .token_to_id(EOS_TOKEN)
            .ok_or_else(|| ModelError::MissingEos {
                path: path.to_path_buf(),
            })?;
        Ok(Tokenizer {
            inner,
            eos_id,
            path: path.to_path_buf(),
        })
    }

    /// Id of `<|endoftext|>`.
    pub fn eos_id(&self) -> u32 {
        self.eos_id
    }

    /// Token ids of `text` with no special tokens added.
    pub fn encode_raw(&self, text: &str) -> ModelResult<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| ModelError::Tokenizer {
                path: self.path.clone(),
                reason: format!("failed to encode text: {e}"),
            })?;
        Ok(enc.get_ids().to_vec())
    }

    /// Ids of a document: the text as is, then `<|endoftext|>`. Never truncated.
    pub fn encode_document(&self, text: &str) -> ModelResult<Vec<u32>> {
        let mut ids = self.encode_raw(text)?;
        ids.push(self.eos_id);
        Ok(ids)
    }

    /// Ids of a query with its task instruction, in Qwen3-Embedding's format, then EOS.
    pub fn encode_query(&self, instruction: &str, text: &str) -> ModelResult<Vec<u32>> {
        self.encode_document(&format_query(instruction, text))
    }

    /// Decodes ids back to text (special tokens kept), for diagnostics.
    pub fn decode(&self, ids: &[u32]) -> ModelResult<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| ModelError::Tokenizer {
                path: self.path.clone(),
                reason: format!("failed to decode: {e}"),
            })
    }
}

/// Qwen3-Embedding's query format: `Instruct: {task}\nQuery:{text}`.
pub fn format_query(instruction: &str, text: &str) -> String {
    format!("Instruct: {instruction}\nQuery:{text}")
}
