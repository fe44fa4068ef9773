//! Each token's bytes as its tokenizer writes them, for masking tokens by the text they add
//! (structured output): byte-level BPE pieces mapped back through GPT-2's byte alphabet,
//! SentencePiece pieces with `▁` as a space and `<0xHH>` as the byte, added tokens as their
//! text, special tokens as none (they write no text).

use std::collections::HashMap;

use crate::tokenizer::Backend;

/// GPT-2's byte alphabet backwards: the character standing for each byte.
fn byte_level_alphabet() -> HashMap<char, u8> {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let mut shifted = 0;
    (0..=255u8)
        .map(|byte| {
            let c = if printable(byte) {
                char::from(byte)
            } else {
                shifted += 1;
                char::from_u32(256 + shifted - 1).expect("a valid code point")
            };
            (c, byte)
        })
        .collect()
}

/// `<0xHH>`, SentencePiece's byte fallback piece.
fn fallback_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
}

pub(crate) fn of(backend: &Backend) -> Vec<Option<Vec<u8>>> {
    let (size, added, byte_level) = match backend {
        Backend::Tokenizers(t) => {
            let decoder = t.get_decoder().and_then(|d| serde_json::to_string(d).ok());
            let byte_level = decoder.is_some_and(|d| d.contains("\"ByteLevel\""));
            (
                t.get_vocab_size(true),
                t.get_added_tokens_decoder(),
                byte_level,
            )
        }
        Backend::SentencePiece(t) => (t.get_vocab_size(true), t.get_added_tokens_decoder(), false),
    };
    let piece = |id| match backend {
        Backend::Tokenizers(t) => t.id_to_token(id),
        Backend::SentencePiece(t) => t.id_to_token(id),
    };
    let alphabet = byte_level_alphabet();
    (0..size as u32)
        .map(|id| {
            if let Some(token) = added.get(&id) {
                return (!token.special).then(|| token.content.as_bytes().to_vec());
            }
            let piece = piece(id)?;
            if byte_level {
                // A piece outside the alphabet is not byte-level text: its UTF-8.
                return Some(
                    piece
                        .chars()
                        .map(|c| {
                            alphabet
                                .get(&c)
                                .map_or_else(|| c.to_string().into_bytes(), |&b| vec![b])
                        })
                        .collect::<Vec<_>>()
                        .concat(),
                );
            }
            Some(match fallback_byte(&piece) {
                Some(byte) => vec![byte],
                None => piece.replace('▁', " ").into_bytes(),
            })
        })
        .collect()
}
