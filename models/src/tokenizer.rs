//! A model's `tokenizer.json` as the embedding models use it, with its family's conventions
//! ([`TextFormat`]).
//!
//! The models pool the hidden state of an appended end-of-sequence token, so every encoding
//! ends with that id. Texts are never truncated: a paper longer than the model's context is
//! the caller's to split into chunks. Queries carry an instruction in the family's format;
//! documents carry none.

use std::path::{Path, PathBuf};

use crate::error::{ModelError, ModelResult};

/// How a family's inputs are written as text: the token that ends every input (its hidden
/// state is the embedding: last-token pooling) and how a query carries its task instruction.
/// Documents carry no instruction.
#[derive(Debug, Clone, Copy)]
pub struct TextFormat {
    /// The family's name in messages about its tokenizer (`Qwen3`).
    pub family: &'static str,
    /// The end-of-sequence token appended to every input (`<|endoftext|>`).
    pub eos_token: &'static str,
    /// A query's text with its instruction (`Instruct: {instruction}\nQuery:{text}`).
    pub query: fn(instruction: &str, text: &str) -> String,
}

/// `tokenizer.json` loaded with the `tokenizers` crate, plus the EOS id and the query format.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos_id: u32,
    format: TextFormat,
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
    /// Loads `tokenizer.json`; fails if it has no `format.eos_token`.
    pub fn from_file(path: &Path, format: TextFormat) -> ModelResult<Tokenizer> {
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
            .token_to_id(format.eos_token)
            .ok_or_else(|| ModelError::MissingEos {
                path: path.to_path_buf(),
                token: format.eos_token,
                family: format.family,
            })?;
        Ok(Tokenizer {
            inner,
            eos_id,
            format,
            path: path.to_path_buf(),
        })
    }

    /// Id of the end-of-sequence token.
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

    /// A query's text with its task instruction, in the family's format.
    pub fn format_query(&self, instruction: &str, text: &str) -> String {
        (self.format.query)(instruction, text)
    }

    /// Ids of a query with its task instruction, in the family's format, then EOS.
    pub fn encode_query(&self, instruction: &str, text: &str) -> ModelResult<Vec<u32>> {
        self.encode_document(&self.format_query(instruction, text))
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
