//! `--speculative-ngram-external-corpus-path`: texts a server drafts from besides its requests'
//! (its code base, its documents), as SGLang reads them: a JSON Lines file whose every line is
//! a JSON string (or an object with a `text` string). They are tokenized without special
//! tokens once, at start, and kept whole: never dropped as earlier requests' texts are.

use std::path::Path;

use anyhow::{bail, Context, Result};
use grove_core::TokenId;
use grove_engine::{LookupConfig, NgramCorpus};
use grove_model::TextTokenizer;

/// SGLang's default for `--speculative-ngram-external-corpus-max-tokens`.
pub const DEFAULT_MAX_TOKENS: usize = 10_000_000;

/// The texts of `path`, tokenized, as a corpus matching as `config` says; refuses a line that
/// is not a text and a corpus of more than `max_tokens` tokens, naming them.
pub fn load(
    path: &Path,
    max_tokens: usize,
    tokenizer: Option<&TextTokenizer>,
    config: LookupConfig,
) -> Result<NgramCorpus> {
    let Some(tokenizer) = tokenizer else {
        bail!("--speculative-ngram-external-corpus-path needs a model with a tokenizer");
    };
    let file = std::fs::read_to_string(path)
        .with_context(|| format!("reading the ngram corpus {}", path.display()))?;
    let mut texts: Vec<Vec<TokenId>> = Vec::new();
    let mut tokens = 0;
    for (number, line) in file.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let text = text_of(line).with_context(|| {
            format!(
                "{} line {}: expected a JSON string or an object with a \"text\" string",
                path.display(),
                number + 1
            )
        })?;
        let ids = tokenizer.encode(&text, false)?;
        tokens += ids.len();
        if tokens > max_tokens {
            bail!(
                "the ngram corpus {} holds more than --speculative-ngram-external-corpus-max-tokens \
                 ({max_tokens}) tokens by line {}",
                path.display(),
                number + 1
            );
        }
        texts.push(ids);
    }
    Ok(NgramCorpus::of_texts(&texts, config))
}

/// A line's text: a JSON string, or an object's `text` string.
fn text_of(line: &str) -> Result<String> {
    match serde_json::from_str::<serde_json::Value>(line)? {
        serde_json::Value::String(text) => Ok(text),
        serde_json::Value::Object(mut record) => match record.remove("text") {
            Some(serde_json::Value::String(text)) => Ok(text),
            _ => bail!("no \"text\" string"),
        },
        _ => bail!("neither a string nor an object"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_a_string_or_an_object_with_a_text() {
        assert_eq!(text_of(r#""def f():""#).unwrap(), "def f():");
        assert_eq!(
            text_of(r#"{"text": "x = 1", "source": "a.py"}"#).unwrap(),
            "x = 1"
        );
        for bad in [
            r#"{"content": "x"}"#,
            "[1, 2]",
            "def f():",
            r#"{"text": 3}"#,
        ] {
            assert!(text_of(bad).is_err(), "{bad}");
        }
    }
}
