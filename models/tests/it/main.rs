//! The model crate's integration tests, in one binary (one link of candle and tokenizers
//! instead of four).

mod common;

mod families;
mod fp8;
mod golden;
mod loading;
mod masking;
mod qwen_tokenizer;
