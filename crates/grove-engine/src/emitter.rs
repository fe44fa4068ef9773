//! Turns chosen tokens into output: stop checks, incremental text and stop strings.

use grove_core::{FinishReason, StopCondition, TokenId};
use grove_model::TextTokenizer;

use crate::detokenizer::Detokenizer;
use crate::stop_strings::{StopScan, StopStrings};
use crate::EngineError;

/// Turns chosen tokens into output: the stop checks, incremental text and stop strings.
pub(crate) struct Emitter<'a> {
    tokenizer: Option<&'a TextTokenizer>,
    stop: StopCondition,
    detokenizer: Detokenizer,
    stop_strings: StopStrings,
    token_ids: Vec<TokenId>,
    text: String,
    /// A stop string matched: nothing after it is ever released.
    stopped_by_string: bool,
}

impl<'a> Emitter<'a> {
    pub(crate) fn new(tokenizer: Option<&'a TextTokenizer>, stop: &StopCondition) -> Self {
        Self {
            tokenizer,
            stop: stop.clone(),
            detokenizer: Detokenizer::new(),
            stop_strings: StopStrings::new(stop.stop_strings.clone()),
            token_ids: Vec::new(),
            text: String::new(),
            stopped_by_string: false,
        }
    }

    /// Every token emitted so far.
    pub(crate) fn token_ids(&self) -> &[TokenId] {
        &self.token_ids
    }

    /// Records one token; returns why generation ends, if it does.
    pub(crate) fn emit(
        &mut self,
        token: TokenId,
        on_text: &mut impl FnMut(&str),
    ) -> Result<Option<FinishReason>, EngineError> {
        self.token_ids.push(token);
        if self.stop.is_stop_token(token) {
            return Ok(Some(FinishReason::Stop));
        }
        if let Some(tokenizer) = self.tokenizer {
            let piece = self.detokenizer.push(tokenizer, token)?;
            match self.stop_strings.push(&piece) {
                StopScan::Continue(text) => self.release(&text, on_text),
                StopScan::Stopped(text) => {
                    self.release(&text, on_text);
                    self.stopped_by_string = true;
                    return Ok(Some(FinishReason::Stop));
                }
            }
        }
        Ok((self.token_ids.len() >= self.stop.max_new_tokens).then_some(FinishReason::Length))
    }

    pub(crate) fn release(&mut self, text: &str, on_text: &mut impl FnMut(&str)) {
        if !text.is_empty() {
            self.text.push_str(text);
            on_text(text);
        }
    }

    /// Releases held-back text (unless a stop string ended generation) and returns the output.
    pub(crate) fn finish(
        mut self,
        on_text: &mut impl FnMut(&str),
    ) -> Result<(Vec<TokenId>, String), EngineError> {
        if let Some(tokenizer) = self.tokenizer.filter(|_| !self.stopped_by_string) {
            let tail = self.detokenizer.flush(tokenizer)?;
            let text = match self.stop_strings.push(&tail) {
                StopScan::Continue(text) => text + &self.stop_strings.flush(),
                StopScan::Stopped(text) => text,
            };
            self.release(&text, on_text);
        }
        Ok((self.token_ids, self.text))
    }
}
