//! Training text: source files gathered from directories, a byte-level BPE tokenizer trained
//! on them with the `tokenizers` crate, and the token stream cut into seeded random windows.

use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer, TokenizerBuilder};

use crate::TrainError;

/// Special tokens of grove's trained tokenizers, in id order after the byte alphabet merges
/// are learned: end of text (document separator, EOS), the ChatML markers, and the mask token
/// the DFlash drafter fills its blocks with (never seen in text, so the target never uses it).
pub const SPECIAL_TOKENS: [&str; 4] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"];

/// ChatML, as Qwen models use it.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Directory names skipped while gathering (tests and vendored packages are not the code we
/// want the model to learn from, and they would double the corpus).
const SKIPPED_DIRS: [&str; 5] = ["test", "tests", "site-packages", "__pycache__", "idle_test"];

/// Source files under `roots` (files are taken as given; directories are walked) whose
/// extension is in `extensions`, sorted so the corpus order is reproducible.
pub fn gather_files(roots: &[PathBuf], extensions: &[&str]) -> Result<Vec<PathBuf>, TrainError> {
    let mut files = Vec::new();
    let mut stack: Vec<PathBuf> = roots.to_vec();
    while let Some(path) = stack.pop() {
        if path.is_file() {
            files.push(path);
            continue;
        }
        let entries = std::fs::read_dir(&path).map_err(|source| TrainError::Io {
            path: path.clone(),
            source,
        })?;
        for entry in entries.flatten() {
            let child = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if child.is_dir() {
                if !SKIPPED_DIRS.contains(&name.as_str()) && !name.starts_with('.') {
                    stack.push(child);
                }
            } else if child
                .extension()
                .is_some_and(|e| extensions.iter().any(|x| e == *x))
            {
                files.push(child);
            }
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(TrainError::Data(format!(
            "no files with extensions {extensions:?} under {roots:?}"
        )));
    }
    Ok(files)
}

/// Trains a byte-level BPE tokenizer of `vocab_size` tokens (special tokens included) on `files`.
pub fn train_tokenizer(files: &[PathBuf], vocab_size: usize) -> Result<Tokenizer, TrainError> {
    let special: Vec<AddedToken> = SPECIAL_TOKENS
        .iter()
        .map(|t| AddedToken::from(t.to_string(), true))
        .collect();
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(vocab_size)
        .min_frequency(2)
        .special_tokens(special)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tokenizer = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_normalizer(None::<tokenizers::NormalizerWrapper>)
        .with_pre_tokenizer(Some(ByteLevel::new(false, true, true)))
        .with_post_processor(Some(ByteLevel::new(false, true, true)))
        .with_decoder(Some(ByteLevel::new(false, true, true)))
        .build()
        .map_err(|e| TrainError::Data(format!("building the tokenizer: {e}")))?;
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    tokenizer
        .train_from_files(&mut trainer, names)
        .map_err(|e| TrainError::Data(format!("training the tokenizer: {e}")))?;
    Ok(tokenizer.into())
}

/// All `files` tokenized by `encode` and joined, each followed by `<|endoftext|>` (looked up
/// with `token_to_id`).
pub fn tokenize_files<E: std::fmt::Display>(
    files: &[PathBuf],
    token_to_id: impl Fn(&str) -> Option<u32>,
    encode: impl Fn(&str) -> Result<Vec<u32>, E>,
) -> Result<Vec<u32>, TrainError> {
    let eos = token_to_id(SPECIAL_TOKENS[0])
        .ok_or_else(|| TrainError::Data("the tokenizer lacks <|endoftext|>".into()))?;
    let mut tokens = Vec::new();
    for file in files {
        let bytes = std::fs::read(file).map_err(|source| TrainError::Io {
            path: file.clone(),
            source,
        })?;
        // Sources in other encodings are skipped rather than guessed at.
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        let ids =
            encode(&text).map_err(|e| TrainError::Data(format!("{}: {e}", file.display())))?;
        tokens.extend_from_slice(&ids);
        tokens.push(eos);
    }
    Ok(tokens)
}

/// Token ids stored as little-endian u16 (vocabularies here are < 65536).
pub fn save_tokens(path: &Path, tokens: &[u32]) -> Result<(), TrainError> {
    let bytes: Vec<u8> = tokens
        .iter()
        .flat_map(|&t| (t as u16).to_le_bytes())
        .collect();
    std::fs::write(path, bytes).map_err(|source| TrainError::Io {
        path: path.to_owned(),
        source,
    })
}

pub fn load_tokens(path: &Path) -> Result<Vec<u32>, TrainError> {
    let bytes = std::fs::read(path).map_err(|source| TrainError::Io {
        path: path.to_owned(),
        source,
    })?;
    Ok(bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as u32)
        .collect())
}

/// The random stream of micro-batch `micro` of step `step`: a pure function of its arguments,
/// so a resumed run draws exactly the batches the interrupted one would have.
pub fn step_rng(seed: u64, step: u64, micro: u64) -> rand_chacha::ChaCha12Rng {
    rand_chacha::ChaCha12Rng::seed_from_u64(
        seed ^ step.wrapping_mul(0x9e3779b97f4a7c15) ^ micro.wrapping_mul(0xbf58476d1ce4e5b9),
    )
}

/// A token stream split into training and held-out parts, sampled as random windows.
#[derive(Debug, Clone)]
pub struct TokenStream {
    pub train: Vec<u32>,
    pub held_out: Vec<u32>,
}

impl TokenStream {
    /// Holds out the last `fraction` of the stream (at least one window's worth).
    pub fn split(tokens: Vec<u32>, fraction: f64, window: usize) -> Result<Self, TrainError> {
        let held = ((tokens.len() as f64 * fraction) as usize).max(window + 1);
        if tokens.len() < held + window + 1 {
            return Err(TrainError::Data(format!(
                "{} tokens are too few for windows of {window}",
                tokens.len()
            )));
        }
        let cut = tokens.len() - held;
        Ok(Self {
            held_out: tokens[cut..].to_vec(),
            train: tokens[..cut].to_vec(),
        })
    }

    /// `count` windows of `len` tokens from `part`, the same for the same `(seed, step, micro)`:
    /// a resumed run sees exactly the batches the interrupted one would have.
    pub fn windows(
        part: &[u32],
        count: usize,
        len: usize,
        seed: u64,
        step: u64,
        micro: u64,
    ) -> Vec<Vec<u32>> {
        let mut rng = step_rng(seed, step, micro);
        (0..count)
            .map(|_| {
                let start = rng.random_range(0..part.len() - len);
                part[start..start + len].to_vec()
            })
            .collect()
    }
}

/// Token ids stored as little-endian u32 (large vocabularies, such as a GGUF target's).
pub fn save_tokens_u32(path: &Path, tokens: &[u32]) -> Result<(), TrainError> {
    let bytes: Vec<u8> = tokens.iter().flat_map(|&t| t.to_le_bytes()).collect();
    std::fs::write(path, bytes).map_err(|source| TrainError::Io {
        path: path.to_owned(),
        source,
    })
}

pub fn load_tokens_u32(path: &Path) -> Result<Vec<u32>, TrainError> {
    let bytes = std::fs::read(path).map_err(|source| TrainError::Io {
        path: path.to_owned(),
        source,
    })?;
    Ok(bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}
