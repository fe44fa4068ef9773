//! Incremental detokenization: text is released only once a token sequence decodes to a
//! complete UTF-8 character, so a character split across byte-level tokens never shows up as
//! U+FFFD. A prefix of already-released tokens is re-decoded with the new ones so that
//! tokenizers whose decoding depends on neighbours (SentencePiece's leading space) stay right.

use grove_core::TokenId;
use grove_model::{ModelError, TextTokenizer};

#[derive(Debug, Default)]
pub struct Detokenizer {
    ids: Vec<TokenId>,
    prefix_offset: usize,
    read_offset: usize,
}

impl Detokenizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token; returns the text it completes, if any.
    pub fn push(
        &mut self,
        tokenizer: &TextTokenizer,
        token: TokenId,
    ) -> Result<String, ModelError> {
        self.ids.push(token);
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..])?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') {
            if let Some(delta) = full.get(prefix.len()..) {
                self.prefix_offset = self.read_offset;
                self.read_offset = self.ids.len();
                return Ok(delta.to_owned());
            }
        }
        Ok(String::new())
    }

    /// Whatever is still held back at the end of generation, less an incomplete character at
    /// its very end (output cut by `max_tokens` inside a character): the text never ends in a
    /// U+FFFD that only stands for missing bytes; the token ids still carry them.
    pub fn flush(&mut self, tokenizer: &TextTokenizer) -> Result<String, ModelError> {
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..])?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        let tail = full.get(prefix.len()..).unwrap_or_default();
        Ok(tail.trim_end_matches('\u{FFFD}').to_owned())
    }
}
