//! The sentence-transformers layout every family shares: what a model directory says follows
//! its transformer (pooling, dense projections, normalisation) and which prompts its inputs
//! carry ([`layout`]), and that head computed on the hidden states ([`head`]). TEI reads the
//! same files; the pooling, the prompts and the normalisation come from the directory, not from
//! code, and where a directory has none, from the family's [`LayoutDefaults`].

pub mod head;
pub mod layout;

pub use head::SentenceHead;
pub use layout::{DenseActivation, DenseSpec, LayoutDefaults, Pooling, SentenceLayout};
