//! A model's `tokenizer.json` as the embedding models use it, with its family's conventions
//! ([`TextFormat`]) and the directory's prompts.
//!
//! Every sequence a model reads is framed by its special tokens ([`Framing`]): Qwen3's inputs
//! end with `<|endoftext|>` (its hidden state is the embedding), a BERT's read
//! `[CLS] … [SEP]`, an XLM-R's `<s> … </s>`, EmbeddingGemma's `<bos> … <eos>`. Texts are never
//! truncated: a paper longer than the model's context is the caller's to split into chunks,
//! each framed the same way. Queries carry an instruction in the family's format; documents
//! carry the directory's document prompt (E5's `passage: `), if any.

use std::path::{Path, PathBuf};

use crate::error::{ModelError, ModelResult};
use crate::text_rule::{with_lowercase_first, TextRule};

/// The special tokens around every sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Specials {
    /// Only this token, appended; the file's post-processor is not used (Qwen3's
    /// `<|endoftext|>`).
    Eos(&'static str),
    /// What the file's post-processor adds (`[CLS] $A [SEP]`, `<s> $A </s>`, `<bos> $A`),
    /// then `ensure_end` appended where the post-processor does not end with it (Gemma's
    /// tokenizer adds `<bos>` only; EmbeddingGemma reads `<eos>` too). Where the file's
    /// post-processor adds nothing (a `null` one, or ByteLevel's alone), `otherwise` frames the
    /// text, as transformers' tokenizer classes frame it whatever the file says.
    FromFile {
        ensure_end: Option<&'static str>,
        otherwise: (&'static str, &'static str),
    },
}

/// How a query carries its task.
#[derive(Debug, Clone, Copy)]
pub enum QueryFormat {
    /// The family wraps the task in its own words (`Instruct: {task}\nQuery:{text}`).
    Instructed(fn(instruction: &str, text: &str) -> String),
    /// The task is a prompt written before the text (E5's `query: `, EmbeddingGemma's
    /// `task: search result | query: `).
    Prompt,
}

/// How a family's inputs are written: the special tokens around them and the query format.
#[derive(Debug, Clone, Copy)]
pub struct TextFormat {
    /// The family's name in messages about its tokenizer (`Qwen3`).
    pub family: &'static str,
    pub specials: Specials,
    pub query: QueryFormat,
    /// Whether embedfleet stripped a text of leading and trailing whitespace before it recorded
    /// a run's [`TextRule`] (as sentence-transformers ≤ 5.3 did: the encoders; Qwen3's texts
    /// were tokenised as given): the rule of a run pinned before then.
    pub legacy_strip: bool,
    /// The tokenizer class transformers loads the family's directories with when their
    /// `tokenizer_config.json` names none (`BertTokenizer` for `bert`); see
    /// [`bert_normalizer_as_transformers_builds`].
    pub default_tokenizer_class: Option<&'static str>,
}

impl TextFormat {
    /// A query's text with its instruction.
    pub fn format_query(&self, instruction: &str, text: &str) -> String {
        match self.query {
            QueryFormat::Instructed(format) => format(instruction, text),
            QueryFormat::Prompt => format!("{instruction}{text}"),
        }
    }
}

/// The special-token ids before and after every sequence's own tokens.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Framing {
    pub prefix: Vec<u32>,
    pub suffix: Vec<u32>,
}

impl Framing {
    /// Tokens the framing adds to a sequence.
    pub fn overhead(&self) -> usize {
        self.prefix.len() + self.suffix.len()
    }

    /// `body` framed.
    pub fn wrap(&self, body: &[u32]) -> Vec<u32> {
        let mut seq = Vec::with_capacity(body.len() + self.overhead());
        seq.extend_from_slice(&self.prefix);
        seq.extend_from_slice(body);
        seq.extend_from_slice(&self.suffix);
        seq
    }
}

/// `tokenizer.json` loaded with the `tokenizers` crate, with its framing, query format and
/// document prompt.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    framing: Framing,
    format: TextFormat,
    document_prompt: String,
    document_prompt_ids: Vec<u32>,
    /// Whether a text (prompt included) is stripped of surrounding whitespace first.
    strip: bool,
    /// Whether a text is lowercased as a whole string first (sentence-transformers ≤ 5.3's
    /// `str.lower()`); under [`TextRule::AsGiven`] the normalizer lowercases instead.
    lowercase_whole: bool,
    path: PathBuf,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .field("framing", &self.framing)
            .finish()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json`; fails if a special token `format` needs is not in it.
    pub fn from_file(path: &Path, format: TextFormat) -> ModelResult<Tokenizer> {
        let err = |reason: String| ModelError::Tokenizer {
            path: path.to_path_buf(),
            reason,
        };
        if !path.is_file() {
            return Err(ModelError::MissingFile {
                path: path.to_path_buf(),
                hint: "the model directory needs the tokenizer.json shipped with the model",
            });
        }
        let mut inner = tokenizers::Tokenizer::from_file(path).map_err(|e| err(e.to_string()))?;
        inner
            .with_truncation(None)
            .map_err(|e| err(e.to_string()))?;
        inner.with_padding(None);
        if let Some(dir) = path.parent() {
            bert_normalizer_as_transformers_builds(dir, format, &mut inner)?;
        }
        let id_of = |token: &'static str| {
            inner
                .token_to_id(token)
                .ok_or_else(|| ModelError::MissingEos {
                    path: path.to_path_buf(),
                    token,
                    family: format.family,
                })
        };
        let framing = match format.specials {
            Specials::Eos(eos) => Framing {
                prefix: Vec::new(),
                suffix: vec![id_of(eos)?],
            },
            Specials::FromFile {
                ensure_end,
                otherwise,
            } => {
                let mut framing = post_processor_framing(&inner).map_err(err)?;
                if framing.overhead() == 0 {
                    framing = Framing {
                        prefix: vec![id_of(otherwise.0)?],
                        suffix: vec![id_of(otherwise.1)?],
                    };
                }
                if let Some(end) = ensure_end {
                    let id = id_of(end)?;
                    if framing.suffix.last() != Some(&id) {
                        framing.suffix.push(id);
                    }
                }
                framing
            }
        };
        Ok(Tokenizer {
            inner,
            framing,
            format,
            document_prompt: String::new(),
            document_prompt_ids: Vec::new(),
            strip: false,
            lowercase_whole: false,
            path: path.to_path_buf(),
        })
    }

    /// This tokenizer writing `prompt` before every document's text.
    pub fn with_document_prompt(mut self, prompt: &str) -> ModelResult<Tokenizer> {
        self.document_prompt = prompt.to_string();
        self.document_prompt_ids = self.encode_raw(prompt)?;
        Ok(self)
    }

    /// This tokenizer preparing texts by `rule` (`None`: a run pinned before embedfleet
    /// recorded its rule, whose texts were prepared by the family's old convention, stripped
    /// or not, lowercased as whole strings), lowercasing every text where `lowercase`
    /// (`sentence_bert_config.json`'s `do_lower_case`). Call it before
    /// [`Tokenizer::with_document_prompt`]: the prompt is tokenised as the texts are.
    pub fn with_text_rule(mut self, rule: Option<TextRule>, lowercase: bool) -> Tokenizer {
        match rule {
            Some(TextRule::AsGiven) => {
                self.strip = false;
                self.lowercase_whole = false;
                if lowercase {
                    with_lowercase_first(&mut self.inner);
                }
            }
            Some(TextRule::Stripped) => {
                self.strip = true;
                self.lowercase_whole = lowercase;
            }
            None => {
                self.strip = self.format.legacy_strip;
                self.lowercase_whole = lowercase;
            }
        }
        self
    }

    /// The document prompt's own ids, which open every chunk of a document after its first
    /// (whose prompt is tokenised with its text): each chunk is read as the model was trained
    /// to read a document. Empty without a prompt.
    pub fn document_prompt_ids(&self) -> &[u32] {
        &self.document_prompt_ids
    }

    /// The special tokens around every sequence.
    pub fn framing(&self) -> &Framing {
        &self.framing
    }

    /// The prompt written before every document's text (empty for none).
    pub fn document_prompt(&self) -> &str {
        &self.document_prompt
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

    /// The text the model reads for a document (`None`) or a query with its instruction: the
    /// prompt or the family's query format applied. Tokenised whole, prompt and text together,
    /// as sentence-transformers does.
    pub fn input_text(&self, query_instruction: Option<&str>, text: &str) -> String {
        let text = match query_instruction {
            Some(instruction) => self.format_query(instruction, text),
            None => format!("{}{text}", self.document_prompt),
        };
        let text = if self.strip {
            text.trim().to_string()
        } else {
            text
        };
        if self.lowercase_whole {
            text.to_lowercase()
        } else {
            text
        }
    }

    /// Ids of a document: its prompt and text, framed. Never truncated.
    pub fn encode_document(&self, text: &str) -> ModelResult<Vec<u32>> {
        Ok(self
            .framing
            .wrap(&self.encode_raw(&self.input_text(None, text))?))
    }

    /// A query's text with its task instruction, in the family's format.
    pub fn format_query(&self, instruction: &str, text: &str) -> String {
        self.format.format_query(instruction, text)
    }

    /// Ids of a query with its task instruction, in the family's format, framed.
    pub fn encode_query(&self, instruction: &str, text: &str) -> ModelResult<Vec<u32>> {
        Ok(self
            .framing
            .wrap(&self.encode_raw(&self.input_text(Some(instruction), text))?))
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

/// transformers (5.x) loads a directory whose tokenizer class is `BertTokenizer`
/// (`tokenizer_config.json`'s `tokenizer_class`, else the family's default) by building its
/// normalizer anew from `tokenizer_config.json` — `do_lower_case` (true when left out),
/// `strip_accents`, `tokenize_chinese_chars` — and keeps only the vocabulary of
/// `tokenizer.json`: a cased BERT whose `tokenizer_config.json` leaves `do_lower_case` out is
/// lowercased by sentence-transformers whatever its `tokenizer.json` says. The same normalizer
/// is put here. Every real BERT download checked gives the same one either way.
fn bert_normalizer_as_transformers_builds(
    dir: &Path,
    format: TextFormat,
    inner: &mut tokenizers::Tokenizer,
) -> ModelResult<()> {
    let path = dir.join("tokenizer_config.json");
    let config: serde_json::Value = match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| ModelError::Tokenizer {
            path: path.clone(),
            reason: format!(
                "not valid JSON ({e}): replace it with the file shipped with the model"
            ),
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::Value::Null,
        Err(e) => {
            return Err(ModelError::Tokenizer {
                path,
                reason: format!("failed to read it: {e}"),
            })
        }
    };
    let class = config["tokenizer_class"]
        .as_str()
        .or(format.default_tokenizer_class);
    if !matches!(class, Some("BertTokenizer" | "BertTokenizerFast")) {
        return Ok(());
    }
    let normalizer = tokenizers::normalizers::BertNormalizer::new(
        true,
        config["tokenize_chinese_chars"].as_bool().unwrap_or(true),
        config["strip_accents"].as_bool(),
        config["do_lower_case"].as_bool().unwrap_or(true),
    );
    inner.with_normalizer(Some(normalizer));
    inner.add_tokens(&[]);
    Ok(())
}

/// What the post-processor of `inner` puts around a text's tokens: a probe encoded with and
/// without special tokens, its own tokens found in the first.
fn post_processor_framing(inner: &tokenizers::Tokenizer) -> Result<Framing, String> {
    let encode = |special| {
        inner
            .encode_fast("a", special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| format!("failed to encode a probe: {e}"))
    };
    let (bare, framed) = (encode(false)?, encode(true)?);
    let at = (0..=framed.len().saturating_sub(bare.len()))
        .find(|&i| framed[i..].starts_with(&bare))
        .ok_or("its post-processor changes a text's own tokens, not only around them")?;
    Ok(Framing {
        prefix: framed[..at].to_vec(),
        suffix: framed[at + bare.len()..].to_vec(),
    })
}
