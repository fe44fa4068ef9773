//! GGUF's `llama` (SentencePiece) tokenizer as a compact `tokenizers` model.
//!
//! llama.cpp tokenizes SentencePiece text this way: the text starts as single characters, and
//! of all adjacent pairs whose concatenation is a vocabulary piece, the one with the best score
//! merges first (the leftmost among equal scores), until no pair is a piece; a character that
//! is not a piece becomes its UTF-8 bytes as `<0xXX>` tokens. Only normal pieces take part in
//! merging: control and user-defined pieces are matched whole before the model runs.
//!
//! `tokenizers`' BPE can express the same rule as a merge list (every split of every piece,
//! ranked by score), but for a 262,144-piece vocabulary its tables hold ~69 MB (two string
//! maps and 513,511 merges), a quarter of Gemma 3 270M's weights. Here the pieces are one
//! string, a score and an end offset each, with a hash index of ids: ~7 MB, and no merge list.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};

use hashbrown::{DefaultHashBuilder, HashTable};
use tokenizers::{AddedToken, Model, Token, Trainer};

/// llama.cpp's token types that matter here.
pub(crate) const NORMAL: i64 = 1;
pub(crate) const UNKNOWN: i64 = 2;

/// Pieces, scores and a piece -> id index.
#[derive(Clone)]
pub struct SentencePiece {
    /// Every piece, back to back.
    text: String,
    /// `ends[id]`: where piece `id` ends in `text` (it starts where piece `id - 1` ends).
    ends: Vec<u32>,
    scores: Vec<f32>,
    /// Normal pieces, the ones merges may produce.
    mergeable: Vec<bool>,
    index: HashTable<u32>,
    hasher: DefaultHashBuilder,
    /// The `<0xXX>` piece of each byte, where the vocabulary has it.
    bytes: Vec<Option<u32>>,
    unknown: Option<u32>,
}

impl std::fmt::Debug for SentencePiece {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentencePiece")
            .field("pieces", &self.ends.len())
            .field("unknown", &self.unknown)
            .finish_non_exhaustive()
    }
}

/// A candidate merge of two adjacent symbols; the heap pops the best score, then the leftmost.
#[derive(Debug, PartialEq)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// Bytes of the merged piece: a bigram whose symbols changed since it was pushed no longer
    /// sums to this and is skipped.
    len: usize,
}

impl Eq for Bigram {}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A run of characters in the linked list of symbols; `len == 0` once merged into its left
/// neighbour.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl SentencePiece {
    /// Builds the model from GGUF's `tokenizer.ggml.tokens`, `.token_type` and `.scores`.
    pub fn new(pieces: &[String], types: &[i64], scores: &[f32]) -> Result<Self, String> {
        if scores.len() != pieces.len() {
            return Err(format!(
                "{} scores for {} tokens",
                scores.len(),
                pieces.len()
            ));
        }
        if u32::try_from(pieces.iter().map(String::len).sum::<usize>()).is_err() {
            return Err("the vocabulary's text exceeds 4 GiB".into());
        }
        let mut text = String::with_capacity(pieces.iter().map(String::len).sum());
        let mut ends = Vec::with_capacity(pieces.len());
        for piece in pieces {
            text.push_str(piece);
            ends.push(text.len() as u32);
        }
        let piece = |id: u32| piece_of(&text, &ends, id);
        let hasher = DefaultHashBuilder::default();
        let mut index = HashTable::with_capacity(pieces.len());
        for id in 0..pieces.len() as u32 {
            let hash = hasher.hash_one(piece(id));
            // A piece listed twice resolves to its last id, as llama.cpp's map does.
            match index.entry(
                hash,
                |&other| piece(other) == piece(id),
                |&other| hasher.hash_one(piece(other)),
            ) {
                hashbrown::hash_table::Entry::Occupied(mut slot) => *slot.get_mut() = id,
                hashbrown::hash_table::Entry::Vacant(slot) => {
                    slot.insert(id);
                }
            }
        }
        let mut model = Self {
            text,
            ends,
            scores: scores.to_vec(),
            mergeable: (0..pieces.len())
                .map(|i| types.get(i).copied().unwrap_or(NORMAL) == NORMAL)
                .collect(),
            index,
            hasher,
            bytes: Vec::new(),
            unknown: None,
        };
        model.bytes = (0..=255u8)
            .map(|b| model.lookup(&format!("<0x{b:02X}>")))
            .collect();
        model.unknown = types.iter().position(|&t| t == UNKNOWN).map(|id| id as u32);
        Ok(model)
    }

    fn piece(&self, id: u32) -> &str {
        piece_of(&self.text, &self.ends, id)
    }

    fn lookup(&self, piece: &str) -> Option<u32> {
        self.index
            .find(self.hasher.hash_one(piece), |&id| self.piece(id) == piece)
            .copied()
    }

    /// Pushes the merge of `left` and `right` if their concatenation is a normal piece.
    fn push_bigram(
        &self,
        heap: &mut BinaryHeap<Bigram>,
        text: &str,
        symbols: &[Symbol],
        left: usize,
        right: usize,
    ) {
        let (l, r) = (symbols[left], symbols[right]);
        let len = l.len + r.len;
        if let Some(id) = self.lookup(&text[l.start..l.start + len]) {
            if self.mergeable[id as usize] {
                heap.push(Bigram {
                    score: self.scores[id as usize],
                    left,
                    right,
                    len,
                });
            }
        }
    }

    /// The ids the text becomes, with their byte offsets in `text`.
    fn pieces(&self, text: &str) -> Result<Vec<Token>, String> {
        let mut symbols: Vec<Symbol> = text
            .char_indices()
            .map(|(start, c)| Symbol {
                start,
                len: c.len_utf8(),
                prev: None,
                next: None,
            })
            .collect();
        let count = symbols.len();
        for (i, symbol) in symbols.iter_mut().enumerate() {
            symbol.prev = i.checked_sub(1);
            symbol.next = (i + 1 < count).then_some(i + 1);
        }
        let mut heap = BinaryHeap::new();
        for right in 1..count {
            self.push_bigram(&mut heap, text, &symbols, right - 1, right);
        }
        while let Some(bigram) = heap.pop() {
            let (left, right) = (symbols[bigram.left], symbols[bigram.right]);
            if left.len == 0 || right.len == 0 || left.len + right.len != bigram.len {
                continue; // stale: one side merged elsewhere since
            }
            symbols[bigram.left].len = bigram.len;
            symbols[bigram.left].next = right.next;
            symbols[bigram.right].len = 0;
            if let Some(next) = right.next {
                symbols[next].prev = Some(bigram.left);
                self.push_bigram(&mut heap, text, &symbols, bigram.left, next);
            }
            if let Some(prev) = left.prev {
                self.push_bigram(&mut heap, text, &symbols, prev, bigram.left);
            }
        }
        let mut tokens = Vec::with_capacity(count);
        let mut at = (count > 0).then_some(0);
        while let Some(i) = at {
            let Symbol { start, len, .. } = symbols[i];
            let offsets = (start, start + len);
            let piece = &text[start..start + len];
            match self.lookup(piece) {
                Some(id) => tokens.push(Token::new(id, piece.to_owned(), offsets)),
                // Only a single character can be outside the vocabulary (merges make pieces).
                None => {
                    for byte in piece.bytes() {
                        let id = self.bytes[byte as usize].or(self.unknown).ok_or_else(|| {
                            format!("{piece:?} is not in the vocabulary, which has neither its byte pieces nor an unknown piece")
                        })?;
                        tokens.push(Token::new(id, self.piece(id).to_owned(), offsets));
                    }
                }
            }
            at = symbols[i].next;
        }
        Ok(tokens)
    }
}

fn piece_of<'a>(text: &'a str, ends: &[u32], id: u32) -> &'a str {
    let id = id as usize;
    let start = if id == 0 { 0 } else { ends[id - 1] as usize };
    &text[start..ends[id] as usize]
}

impl Model for SentencePiece {
    type Trainer = Untrainable;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        Ok(self.pieces(sequence)?)
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.lookup(token)
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        ((id as usize) < self.ends.len()).then(|| self.piece(id).to_owned())
    }

    fn get_vocab(&self) -> HashMap<String, u32> {
        (0..self.ends.len() as u32)
            .map(|id| (self.piece(id).to_owned(), id))
            .collect()
    }

    fn get_vocab_size(&self) -> usize {
        self.ends.len()
    }

    fn save(&self, _folder: &Path, _prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        Err("a SentencePiece model rebuilt from GGUF metadata is not saved: the GGUF file is its source".into())
    }

    fn get_trainer(&self) -> Untrainable {
        Untrainable
    }
}

/// `tokenizers` asks every model for a trainer; this model is read from a GGUF file, never
/// trained, so its trainer refuses.
#[derive(Debug, Clone, Copy)]
pub struct Untrainable;

impl Trainer for Untrainable {
    type Model = SentencePiece;

    fn should_show_progress(&self) -> bool {
        false
    }

    fn train(&self, _model: &mut SentencePiece) -> tokenizers::Result<Vec<AddedToken>> {
        Err("a SentencePiece model from GGUF metadata cannot be trained".into())
    }

    fn feed<I, S, F>(&mut self, _iterator: I, _process: F) -> tokenizers::Result<()>
    where
        I: Iterator<Item = S> + Send,
        S: AsRef<str> + Send,
        F: Fn(&str) -> tokenizers::Result<Vec<String>> + Sync,
    {
        Err("a SentencePiece model from GGUF metadata cannot be trained".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The rule stated plainly, quadratic: merge the best-scoring (then leftmost) adjacent pair
    /// whose concatenation is a normal piece, until none is.
    fn naive(pieces: &[String], types: &[i64], scores: &[f32], text: &str) -> Vec<u32> {
        let id = |p: &str| pieces.iter().rposition(|q| q == p);
        let mut symbols: Vec<String> = text.chars().map(String::from).collect();
        loop {
            let best = (1..symbols.len())
                .filter_map(|i| {
                    let joined = format!("{}{}", symbols[i - 1], symbols[i]);
                    id(&joined)
                        .filter(|&t| types[t] == NORMAL)
                        .map(|t| (scores[t], i))
                })
                .fold(None, |best: Option<(f32, usize)>, (s, i)| match best {
                    Some((b, _)) if b >= s => best,
                    _ => Some((s, i)),
                });
            let Some((_, i)) = best else { break };
            let right = symbols.remove(i);
            symbols[i - 1].push_str(&right);
        }
        symbols
            .iter()
            .flat_map(|s| match id(s) {
                Some(t) => vec![t as u32],
                None => s
                    .bytes()
                    .map(|b| id(&format!("<0x{b:02X}>")).unwrap() as u32)
                    .collect(),
            })
            .collect()
    }

    fn vocabulary() -> (Vec<String>, Vec<i64>, Vec<f32>) {
        let mut pieces: Vec<String> = vec!["<unk>".into(), "<s>".into()];
        let mut types = vec![UNKNOWN, 3];
        pieces.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
        types.extend([6; 256]);
        let normal = [
            "a", "b", "c", "▁", "é", "ab", "bc", "abc", "▁a", "▁ab", "ca", "cab", "bb", "aa",
            "aaa", "é▁", "ba", "<s>b",
        ];
        pieces.extend(normal.iter().map(|p| p.to_string()));
        types.extend(normal.iter().map(|_| NORMAL));
        // "abab" is user-defined: it must never come out of merges.
        pieces.push("abab".into());
        types.push(4);
        // Equal scores among some pieces, so the leftmost rule decides.
        let scores = (0..pieces.len()).map(|i| -((i % 7) as f32)).collect();
        (pieces, types, scores)
    }

    #[test]
    fn merges_by_score_then_leftmost_like_the_plain_rule() {
        let (pieces, types, scores) = vocabulary();
        let model = SentencePiece::new(&pieces, &types, &scores).unwrap();
        let alphabet: Vec<char> = "abc▁é<s>xö".chars().collect();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for _ in 0..2000 {
            let len = rng.random_range(0..14);
            let text: String = (0..len)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            let ours: Vec<u32> = model.pieces(&text).unwrap().iter().map(|t| t.id).collect();
            assert_eq!(ours, naive(&pieces, &types, &scores, &text), "{text:?}");
        }
    }

    #[test]
    fn offsets_cover_the_text_and_bytes_fall_back() {
        let (pieces, types, scores) = vocabulary();
        let model = SentencePiece::new(&pieces, &types, &scores).unwrap();
        let tokens = model.pieces("abö").unwrap();
        let values: Vec<&str> = tokens.iter().map(|t| t.value.as_str()).collect();
        assert_eq!(values, ["ab", "<0xC3>", "<0xB6>"]);
        assert_eq!(tokens[0].offsets, (0, 2));
        assert_eq!(tokens[1].offsets, (2, 4));
        assert_eq!(model.token_to_id("abab"), Some(pieces.len() as u32 - 1));
        assert_eq!(model.id_to_token(2).as_deref(), Some("<0x00>"));
        assert_eq!(model.get_vocab_size(), pieces.len());
        assert!(model.pieces("").unwrap().is_empty());
    }

    #[test]
    fn without_byte_pieces_unknown_stands_in_and_without_it_the_error_names_the_text() {
        let pieces: Vec<String> = ["<unk>", "a"].iter().map(|p| p.to_string()).collect();
        let model = SentencePiece::new(&pieces, &[UNKNOWN, NORMAL], &[0.0, 0.0]).unwrap();
        let ids: Vec<u32> = model.pieces("aé").unwrap().iter().map(|t| t.id).collect();
        assert_eq!(ids, [1, 0, 0]);
        let model = SentencePiece::new(&pieces[1..], &[NORMAL], &[0.0]).unwrap();
        let error = model.pieces("é").unwrap_err();
        assert!(error.contains("\"é\""), "{error}");
        assert!(SentencePiece::new(&pieces, &[NORMAL, NORMAL], &[0.0]).is_err());
    }
}
