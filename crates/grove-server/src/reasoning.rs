//! Reasoning read out of a thinking model's text (`--reasoning-parser`, as vLLM and SGLang
//! name it): what it writes between `<think>` and `</think>` is answered as the message's
//! `reasoning_content`, the rest as its `content`.
//!
//! One splitter serves whole texts and streams alike, so a stream's pieces always add up to the
//! non-streamed answer: text that may still turn out to be a tag, or whitespace that may still
//! turn out to border one, waits for the text after it.

use std::str::FromStr;

use grove_core::TokenId;
use grove_engine::structured::ReasoningTokens;
use grove_model::TextTokenizer;

/// Where a model's reasoning is in its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    /// Qwen3 (hybrid thinking): reasoning only when the text opens with `<think>`, up to
    /// `</think>`; a text that does not (`enable_thinking: false`, whose template closes an
    /// empty block in the prompt) is all content.
    Qwen3,
    /// DeepSeek-R1 and models whose template opens the block in the prompt (QwQ, Qwen3's
    /// thinking-only releases): the text is reasoning from its start (a `<think>` the model
    /// writes itself dropped) up to `</think>`, all of it if the block never closes.
    DeepSeekR1,
}

pub const OPEN: &str = "<think>";
pub const CLOSE: &str = "</think>";

impl FromStr for ReasoningParser {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        match name {
            "qwen3" => Ok(Self::Qwen3),
            "deepseek-r1" | "deepseek_r1" => Ok(Self::DeepSeekR1),
            other => Err(format!(
                "unknown reasoning parser `{other}` (known: qwen3, deepseek-r1)"
            )),
        }
    }
}

impl ReasoningParser {
    pub fn name(self) -> &'static str {
        match self {
            Self::Qwen3 => "qwen3",
            Self::DeepSeekR1 => "deepseek-r1",
        }
    }

    /// How many of an answer's `tokens` (its `text`) are its reasoning block, the tags
    /// included: up to the first `close` token, all of them for a block left open, none for
    /// a text without one.
    pub fn reasoning_tokens(self, tokens: &[TokenId], text: &str, close: TokenId) -> usize {
        let opens = match self {
            Self::Qwen3 => text.trim_start().starts_with(OPEN),
            Self::DeepSeekR1 => true,
        };
        if !opens {
            return 0;
        }
        tokens
            .iter()
            .position(|&t| t == close)
            .map_or(tokens.len(), |at| at + 1)
    }

    /// The tokens a schema waits for (`None` where the tags are not single tokens).
    pub fn tokens(self, tokenizer: &TextTokenizer) -> Option<ReasoningTokens> {
        let close = tokenizer.token_to_id(CLOSE)?;
        let open = match self {
            Self::Qwen3 => Some(tokenizer.token_to_id(OPEN)?),
            Self::DeepSeekR1 => None,
        };
        Some(ReasoningTokens { open, close })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing but whitespace read: an opening tag may still come.
    Start,
    /// Inside the reasoning (its leading whitespace is dropped).
    Reasoning { begun: bool },
    /// After the reasoning, or with none (leading whitespace after a closed block dropped).
    Content { begun: bool },
}

/// Reasoning and content released by one piece of text.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

/// Splits a text, as it comes, into reasoning and content.
#[derive(Debug, Clone)]
pub struct Splitter {
    parser: ReasoningParser,
    phase: Phase,
    /// Read but not released: it may be part of a tag, or whitespace that may border one.
    pending: String,
}

impl Splitter {
    pub fn new(parser: ReasoningParser) -> Self {
        Self {
            parser,
            phase: Phase::Start,
            pending: String::new(),
        }
    }

    /// Reads `text`; returns what may be released now.
    pub fn push(&mut self, text: &str) -> Split {
        self.pending.push_str(text);
        let mut out = Split::default();
        loop {
            let progressed = match self.phase {
                Phase::Start => self.start(),
                Phase::Reasoning { begun } => self.reasoning(begun, &mut out.reasoning),
                Phase::Content { begun } => self.content(begun, &mut out.content),
            };
            if !progressed {
                return out;
            }
        }
    }

    /// The end of the text: releases what was held (a block left open is reasoning to the
    /// end, trailing whitespace dropped).
    pub fn finish(&mut self) -> Split {
        let rest = std::mem::take(&mut self.pending);
        let mut out = Split::default();
        match self.phase {
            Phase::Start => match self.parser {
                ReasoningParser::Qwen3 => out.content = rest,
                ReasoningParser::DeepSeekR1 => out.reasoning = rest.trim().to_owned(),
            },
            Phase::Reasoning { .. } => out.reasoning = rest.trim_end().to_owned(),
            Phase::Content { begun } => {
                out.content = if begun {
                    rest
                } else {
                    rest.trim_start().into()
                }
            }
        }
        out
    }

    /// Whole text at once: the same split a stream's pieces add up to.
    pub fn split(parser: ReasoningParser, text: &str) -> Split {
        let mut splitter = Self::new(parser);
        let mut out = splitter.push(text);
        let rest = splitter.finish();
        out.reasoning.push_str(&rest.reasoning);
        out.content.push_str(&rest.content);
        out
    }

    /// Before anything but whitespace: an opening tag, or the first text.
    fn start(&mut self) -> bool {
        let text = self.pending.trim_start();
        if text.is_empty() || (OPEN.starts_with(text) && text.len() < OPEN.len()) {
            return false;
        }
        if let Some(after) = text.strip_prefix(OPEN) {
            self.pending = after.to_owned();
            self.phase = Phase::Reasoning { begun: false };
        } else {
            self.phase = match self.parser {
                ReasoningParser::Qwen3 => Phase::Content { begun: true },
                ReasoningParser::DeepSeekR1 => {
                    self.pending = text.to_owned();
                    Phase::Reasoning { begun: false }
                }
            };
        }
        true
    }

    /// Reasoning up to the closing tag; a tag's beginning and trailing whitespace wait.
    fn reasoning(&mut self, begun: bool, out: &mut String) -> bool {
        if !begun {
            if !self.skip_whitespace() {
                return false;
            }
            // A closing tag right away: an empty block.
            if !self.pending.starts_with(CLOSE) && !CLOSE.starts_with(self.pending.as_str()) {
                self.phase = Phase::Reasoning { begun: true };
                return true;
            }
        }
        if let Some(at) = self.pending.find(CLOSE) {
            out.push_str(self.pending[..at].trim_end());
            self.pending.drain(..at + CLOSE.len());
            self.phase = Phase::Content { begun: false };
            return true;
        }
        if !begun {
            return false; // A tag's beginning, alone.
        }
        // Hold back what may begin the tag, and whitespace that may end the reasoning.
        let tag_start = (1..CLOSE.len())
            .rev()
            .find(|&n| self.pending.ends_with(&CLOSE[..n]))
            .map_or(self.pending.len(), |n| self.pending.len() - n);
        let release = self.pending[..tag_start].trim_end().len();
        out.push_str(&self.pending[..release]);
        self.pending.drain(..release);
        false
    }

    /// Drops the whitespace the text read so far starts with; whether anything else is left.
    fn skip_whitespace(&mut self) -> bool {
        let kept = self.pending.trim_start().len();
        self.pending.drain(..self.pending.len() - kept);
        !self.pending.is_empty()
    }

    /// Content: all of it, once the whitespace after a closed block is past.
    fn content(&mut self, begun: bool, out: &mut String) -> bool {
        if !begun {
            if !self.skip_whitespace() {
                return false;
            }
            self.phase = Phase::Content { begun: true };
        }
        out.push_str(&self.pending);
        self.pending.clear();
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn split(parser: ReasoningParser, text: &str) -> (String, String) {
        let s = Splitter::split(parser, text);
        (s.reasoning, s.content)
    }

    #[test]
    fn qwen3_reads_a_block_only_where_the_text_opens_one() {
        let q = ReasoningParser::Qwen3;
        let pair = |r: &str, c: &str| (r.to_owned(), c.to_owned());
        assert_eq!(
            split(q, "<think>\nLet me add.\n2 + 2 = 4.\n</think>\n\nIt is 4."),
            pair("Let me add.\n2 + 2 = 4.", "It is 4.")
        );
        assert_eq!(split(q, "It is 4."), pair("", "It is 4."));
        assert_eq!(split(q, "\n  It is 4. "), pair("", "\n  It is 4. "));
        // An empty block, and one cut by the length limit.
        assert_eq!(split(q, "<think>\n\n</think>\n\nHi"), pair("", "Hi"));
        assert_eq!(split(q, "<think>\nHmm, so "), pair("Hmm, so", ""));
        // A tag later in the text is content, as is a text too short to be a tag.
        assert_eq!(
            split(q, "a <think>b</think>"),
            pair("", "a <think>b</think>")
        );
        assert_eq!(split(q, "<thi"), pair("", "<thi"));
        assert_eq!(split(q, ""), pair("", ""));
    }

    #[test]
    fn deepseek_r1_reads_reasoning_from_the_start() {
        let r1 = ReasoningParser::DeepSeekR1;
        let pair = |r: &str, c: &str| (r.to_owned(), c.to_owned());
        assert_eq!(split(r1, "Okay.\n</think>\n\n4"), pair("Okay.", "4"));
        assert_eq!(split(r1, "<think>\nOkay.\n</think>4"), pair("Okay.", "4"));
        assert_eq!(split(r1, "Still thinking"), pair("Still thinking", ""));
        assert_eq!(split(r1, "</think>4"), pair("", "4"));
        assert_eq!(split(r1, "a </thin"), pair("a </thin", ""));
        assert_eq!(split(r1, " <thin"), pair("<thin", ""));
    }

    /// Pieces cut anywhere (within characters' boundaries) add up to the whole text's split,
    /// and nothing is released that the rest of the text could change.
    #[test]
    fn a_stream_adds_up_to_the_whole_text_however_it_is_cut() {
        let texts = [
            "<think>\nLet me think.\n\nStep 1: é.\n</think>\n\nThe answer: {\"a\": 1}\n",
            "  <think>x</think>y",
            "<think>a</thinkb</think>\n c",
            "<think></think>",
            "plain answer </think> here",
            "reasoning é only",
            "\n\n",
            "<think>\n</ </th </think>\t\tdone",
        ];
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(7);
        for parser in [ReasoningParser::Qwen3, ReasoningParser::DeepSeekR1] {
            for text in texts {
                let whole = Splitter::split(parser, text);
                for _ in 0..200 {
                    let mut splitter = Splitter::new(parser);
                    let (mut reasoning, mut content) = (String::new(), String::new());
                    let mut at = 0;
                    while at < text.len() {
                        let mut end = (at + rng.random_range(1..5)).min(text.len());
                        while !text.is_char_boundary(end) {
                            end += 1;
                        }
                        let piece = splitter.push(&text[at..end]);
                        // Released text is final: a prefix of the whole split's.
                        reasoning.push_str(&piece.reasoning);
                        content.push_str(&piece.content);
                        assert!(
                            whole.reasoning.starts_with(&reasoning),
                            "{parser:?} {text:?}"
                        );
                        assert!(whole.content.starts_with(&content), "{parser:?} {text:?}");
                        at = end;
                    }
                    let rest = splitter.finish();
                    reasoning.push_str(&rest.reasoning);
                    content.push_str(&rest.content);
                    assert_eq!((&reasoning, &content), (&whole.reasoning, &whole.content));
                }
            }
        }
    }

    #[test]
    fn reasoning_tokens_run_to_the_closing_token() {
        let (open, close) = (7, 9);
        let q = ReasoningParser::Qwen3;
        assert_eq!(
            q.reasoning_tokens(&[open, 1, 2, close, 3], "<think>ab</think>c", close),
            4
        );
        assert_eq!(q.reasoning_tokens(&[open, 1, 2], "<think>ab", close), 3);
        assert_eq!(q.reasoning_tokens(&[1, close, 2], "a</think>b", close), 0);
        let r1 = ReasoningParser::DeepSeekR1;
        assert_eq!(r1.reasoning_tokens(&[1, close, 2], "a</think>b", close), 2);
        assert_eq!(r1.reasoning_tokens(&[1, 2], "ab", close), 2);
    }

    #[test]
    fn parsers_are_named_as_vllm_and_sglang_name_them() {
        assert_eq!("qwen3".parse(), Ok(ReasoningParser::Qwen3));
        assert_eq!("deepseek_r1".parse(), Ok(ReasoningParser::DeepSeekR1));
        assert_eq!("deepseek-r1".parse(), Ok(ReasoningParser::DeepSeekR1));
        assert!("granite"
            .parse::<ReasoningParser>()
            .unwrap_err()
            .contains("qwen3"));
    }
}
