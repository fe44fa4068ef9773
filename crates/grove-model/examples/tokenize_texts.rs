//! Tokenizes a JSON array of texts with a GGUF model's own tokenizer and writes a JSON array
//! of id lists (no special tokens added), so scripts outside Rust (the GPU drafter trainer,
//! `scripts/drafter_gpu/`) see exactly the ids grove gives the same text.
//!
//! `cargo run --release -p grove-model --example tokenize_texts -- MODEL.gguf IN.json OUT.json`

use std::path::PathBuf;

use anyhow::{Context, Result};
use grove_model::gguf::GgufFile;

fn main() -> Result<()> {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [model, input, output] = args.as_slice() else {
        anyhow::bail!("usage: tokenize_texts MODEL.gguf IN.json OUT.json");
    };
    let tokenizer = GgufFile::open(model)?.tokenizer()?;
    let texts: Vec<String> = serde_json::from_str(
        &std::fs::read_to_string(input).with_context(|| format!("reading {}", input.display()))?,
    )?;
    let ids = texts
        .iter()
        .map(|text| tokenizer.encode(text, false))
        .collect::<Result<Vec<_>, _>>()?;
    std::fs::write(output, serde_json::to_string(&ids)?)?;
    eprintln!(
        "{} texts, {} tokens",
        ids.len(),
        ids.iter().map(Vec::len).sum::<usize>()
    );
    Ok(())
}
