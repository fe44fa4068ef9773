//! Each token's bytes (`TextTokenizer::token_bytes`, what structured output masks by) put
//! back together are the text that was encoded: byte-level BPE (the embedded default's
//! tokenizer.json, Qwen2.5's GGUF vocabulary) and SentencePiece (Gemma 3's GGUF vocabulary, with byte fallback),
//! multi-byte characters split across tokens included.

use std::path::PathBuf;

use grove_model::gguf::GgufFile;
use grove_model::tokenizer::TextTokenizer;

const TEXTS: &[&str] = &[
    "{\"name\": \"Zoë\", \"age\": 30}",
    "fn main() {\n    println!(\"héllo, 世界 🌲\");\n}\n",
    "  leading spaces\tand\ttabs\r\n\\u00e9 é",
];

fn rebuilt(tokenizer: &TextTokenizer, text: &str) -> Vec<u8> {
    let bytes = tokenizer.token_bytes();
    let ids = tokenizer.encode(text, false).unwrap();
    ids.iter()
        .flat_map(|&id| bytes[id as usize].clone().expect("text tokens write text"))
        .collect()
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn byte_level_tokens_write_the_encoded_text() {
    let tokenizer = TextTokenizer::load(&repo().join("assets/default/target")).unwrap();
    for text in TEXTS {
        assert_eq!(rebuilt(&tokenizer, text), text.as_bytes(), "{text}");
    }
    // Special tokens write nothing.
    let bytes = tokenizer.token_bytes();
    let eos = tokenizer.eos_token_id().expect("an eos token");
    assert_eq!(bytes[eos as usize], None);
}

#[test]
fn gguf_vocabularies_write_the_encoded_text() {
    let models = std::env::var_os("GROVE_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("models"));
    for name in [
        "qwen2.5-coder-0.5b-instruct.gguf",
        "gemma-3-270m-q4_k_m.gguf",
    ] {
        let path = models.join(name);
        if !path.is_file() {
            eprintln!("skipped {name}: absent (python3 scripts/install_models.py)");
            continue;
        }
        let tokenizer = GgufFile::open(&path).unwrap().tokenizer().unwrap();
        for text in TEXTS {
            let bytes = rebuilt(&tokenizer, text);
            // SentencePiece writes the space it puts before the text, where it puts one.
            let spaced = format!(" {text}");
            assert!(
                bytes == text.as_bytes() || bytes == spaced.as_bytes(),
                "{name}: {:?}",
                String::from_utf8_lossy(&bytes)
            );
        }
    }
}
