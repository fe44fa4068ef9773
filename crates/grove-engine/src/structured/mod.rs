//! Structured output: generation held to a JSON Schema (OpenAI's `response_format`), by
//! masking, at each position, every token whose bytes would take the text out of the schema.
//!
//! A token is allowed at a position when the schema's matcher (`matcher.rs`), advanced by the
//! text before that position, accepts the token's bytes; a stop token only once the text is a
//! whole value. The mask applies to the row the sampler draws from (after penalties and
//! biases), so the draw is from the target's distribution restricted to what the schema
//! allows, renormalized — vLLM's and llama.cpp's grammar semantics. In a speculative round a
//! tree node's position comes after the emitted text *and* its path's drafts, so its matcher
//! reads both (as the penalties count both): a visited node's path is always text the schema
//! allows, since the walk follows only the target's masked choices, and speculation stays
//! lossless (the tests compare it with plain decoding, greedy and seeded).
//!
//! The mask costs one pass over the vocabulary, walked in byte order as a trie: a prefix is
//! read once for every token that shares it, and one the state refuses refuses them all
//! unread. Inside a string a token with no quote, backslash or control byte is judged without
//! the matcher: by its length alone, or by the string's pattern automaton.

mod matcher;
mod number;
mod pattern;
mod schema;

use std::sync::Arc;

use grove_core::TokenId;

use pattern::Pattern;

use matcher::Reasoning;
pub use matcher::{Matcher, MAX_DEPTH, MAX_INDENT};
pub use schema::{Schema, SchemaError, SUPPORTED_FORMATS, SUPPORTED_KEYWORDS};

/// One text token in the byte-ordered walk of [`TokenBytes`]: what the mask reads of it
/// lies together, in walk order.
#[derive(Debug, Clone, Copy)]
struct Entry {
    token: TokenId,
    /// Its bytes: `text[start..start + len]`.
    start: u32,
    len: u16,
    /// Bytes it shares with the entry before.
    shared: u16,
    /// It is plain string content (see [`matcher::plain_string_bytes`]): inside a string it
    /// is accepted unread.
    plain: bool,
    /// Its first bytes that are plain string content and end a character: inside a string
    /// they leave the state as it was (see [`Matcher::in_open_string`]).
    plain_prefix: u16,
    /// The characters it writes (see [`matcher::characters`]).
    chars: u16,
}

/// Each token's bytes, as the model's tokenizer writes them, indexed for masking.
pub struct TokenBytes {
    /// `None`: a special token, which writes no text (only stop tokens end a value).
    bytes: Vec<Option<Box<[u8]>>>,
    /// The text tokens in byte order: a trie walked in order, so that a prefix is read once
    /// for all the tokens that share it.
    walk: Vec<Entry>,
    /// Their bytes, in that order.
    text: Vec<u8>,
}

// A request's debug print names the vocabulary, not its 150k tokens.
impl std::fmt::Debug for TokenBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenBytes")
            .field("tokens", &self.bytes.len())
            .field("text_tokens", &self.walk.len())
            .finish()
    }
}

impl TokenBytes {
    /// From each token id's bytes (`None` for special tokens).
    pub fn new(bytes: Vec<Option<Vec<u8>>>) -> Self {
        let bytes: Vec<Option<Box<[u8]>>> = bytes
            .into_iter()
            .map(|b| {
                b.filter(|b| !b.is_empty() && b.len() <= u16::MAX as usize)
                    .map(Into::into)
            })
            .collect();
        let mut order: Vec<(TokenId, &[u8])> = bytes
            .iter()
            .enumerate()
            .filter_map(|(id, b)| Some((id as TokenId, b.as_deref()?)))
            .collect();
        order.sort_by(|a, b| a.1.cmp(b.1));
        let mut walk = Vec::with_capacity(order.len());
        let mut text = Vec::new();
        let mut previous: &[u8] = &[];
        for (token, token_bytes) in order {
            let shared = previous
                .iter()
                .zip(token_bytes)
                .take_while(|(a, b)| a == b)
                .count();
            walk.push(Entry {
                token,
                start: text.len() as u32,
                len: token_bytes.len() as u16,
                shared: shared as u16,
                plain: matcher::plain_string_bytes(token_bytes),
                plain_prefix: matcher::plain_prefix(token_bytes) as u16,
                chars: matcher::characters(token_bytes) as u16,
            });
            text.extend_from_slice(token_bytes);
            previous = token_bytes;
        }
        Self { bytes, walk, text }
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The bytes of `token` (`None`: special, or outside the vocabulary).
    pub fn get(&self, token: TokenId) -> Option<&[u8]> {
        self.bytes.get(token as usize).and_then(|b| b.as_deref())
    }
}

/// A request's schema with the vocabulary it masks.
#[derive(Debug, Clone)]
pub struct Grammar {
    pub schema: Arc<Schema>,
    pub vocab: Arc<TokenBytes>,
    /// A thinking model's reasoning block, which the schema holds only after.
    pub reasoning: Option<ReasoningTokens>,
}

/// The tokens that open and close a reasoning block (`<think>`, `</think>`). Without an
/// opening token the text starts inside the block (the prompt opened it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningTokens {
    pub open: Option<TokenId>,
    pub close: TokenId,
}

impl PartialEq for Grammar {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.vocab, &other.vocab)
            && self.schema == other.schema
            && self.reasoning == other.reasoning
    }
}

impl Grammar {
    pub fn new(schema: Schema, vocab: Arc<TokenBytes>) -> Self {
        Self {
            schema: Arc::new(schema),
            vocab,
            reasoning: None,
        }
    }

    /// The schema held only after a reasoning block: inside it any token but a stop token may
    /// come (the value must still follow), and the closing token ends it.
    pub fn after_reasoning(mut self, tokens: ReasoningTokens) -> Self {
        self.reasoning = Some(tokens);
        self
    }

    /// The state before any text.
    pub fn start(&self) -> Matcher {
        let mut state = Matcher::new(&self.schema);
        state.reasoning = match self.reasoning {
            None => Reasoning::Past,
            Some(ReasoningTokens { open: Some(_), .. }) => Reasoning::MayOpen,
            Some(ReasoningTokens { open: None, .. }) => Reasoning::Open,
        };
        state
    }

    /// Advances `state` past `token` (a stop token or one off the schema leaves it dead).
    pub fn advance(&self, state: &mut Matcher, token: TokenId) {
        if let Some(tokens) = self.reasoning {
            match state.reasoning {
                Reasoning::Open => {
                    if token == tokens.close {
                        state.reasoning = Reasoning::Past;
                    }
                    return;
                }
                Reasoning::MayOpen if tokens.open == Some(token) => {
                    state.reasoning = Reasoning::Open;
                    return;
                }
                Reasoning::MayOpen => state.reasoning = Reasoning::Past,
                Reasoning::Past => {}
            }
        }
        match self.vocab.get(token) {
            Some(bytes) => {
                state.feed(&self.schema, bytes);
            }
            None => *state = Matcher::dead(),
        }
    }

    /// Whether `token` may come in `state` (`stops`: the request's stop tokens).
    pub fn allows(&self, state: &Matcher, token: TokenId, stops: &[TokenId]) -> bool {
        match state.reasoning {
            Reasoning::Open => return !stops.contains(&token),
            Reasoning::MayOpen if self.opens(token) => return true,
            _ => {}
        }
        if stops.contains(&token) {
            return state.can_end(&self.schema);
        }
        self.vocab
            .get(token)
            .is_some_and(|bytes| state.accepts(&self.schema, bytes))
    }

    /// [`Grammar::mask`] before the schema holds the text: inside a reasoning block every token
    /// but a stop token; where a block may open, the schema's first tokens and the opening one.
    /// `None` once the schema holds it.
    fn mask_reasoning(
        &self,
        state: &Matcher,
        stops: &[TokenId],
        allowed: &mut [bool],
    ) -> Option<usize> {
        match state.reasoning {
            Reasoning::Open => {
                allowed.fill(true);
                for &stop in stops {
                    if let Some(flag) = allowed.get_mut(stop as usize) {
                        *flag = false;
                    }
                }
                Some(allowed.iter().filter(|&&a| a).count())
            }
            Reasoning::MayOpen => {
                let open = self.reasoning.and_then(|t| t.open)?;
                let mut value = state.clone();
                value.reasoning = Reasoning::Past;
                let count = self.mask(&value, stops, allowed);
                Some(match allowed.get_mut(open as usize) {
                    Some(flag) if !*flag => {
                        *flag = true;
                        count + 1
                    }
                    _ => count,
                })
            }
            Reasoning::Past => None,
        }
    }

    /// `token` opens a reasoning block.
    fn opens(&self, token: TokenId) -> bool {
        self.reasoning.is_some_and(|t| t.open == Some(token))
    }

    /// The state after `token` in `state`, if it may come there (a stop token that may end
    /// the text leaves nothing to continue).
    pub fn after(&self, state: &Matcher, token: TokenId, stops: &[TokenId]) -> Option<Matcher> {
        if state.reasoning != Reasoning::Past {
            // Refused ones (stop tokens in a block, most tokens where one may open) unread.
            if !self.allows(state, token, stops) {
                return None;
            }
            let mut next = state.clone();
            self.advance(&mut next, token);
            return Some(next);
        }
        if stops.contains(&token) {
            return state.can_end(&self.schema).then(Matcher::dead);
        }
        let bytes = self.vocab.get(token)?;
        let mut next = state.clone();
        next.feed(&self.schema, bytes).then_some(next)
    }

    /// The admission rule of a draft tree (`DraftTree::build_where`) whose root is at `state`:
    /// a draft enters only if it may come after its path, so every node is one the target can
    /// choose. It keeps the state after each admitted node's path.
    pub fn admission<'g>(
        &'g self,
        state: &Matcher,
        stops: &'g [TokenId],
    ) -> impl FnMut(usize, TokenId) -> bool + 'g {
        let mut states = vec![state.clone()];
        move |parent, token| match self.after(&states[parent], token, stops) {
            Some(next) => {
                states.push(next);
                true
            }
            None => false,
        }
    }

    /// Marks in `allowed` (one flag per row entry) the tokens that may come in `state`;
    /// returns how many.
    ///
    /// The tokens are read in byte order, keeping the state after each prefix of the last
    /// one read: a token reads only the bytes it does not share with the one before, and
    /// every token under a prefix the schema refused is refused unread. Inside a string a
    /// token's plain rest (no quote, backslash or control byte) is accepted unread.
    pub fn mask(&self, state: &Matcher, stops: &[TokenId], allowed: &mut [bool]) -> usize {
        if let Some(count) = self.mask_reasoning(state, stops, allowed) {
            return count;
        }
        allowed.fill(false);
        let schema = &self.schema;
        // states[d]: after the first d bytes of the token last read, for d <= read.
        let mut states = vec![state.clone()];
        let in_string = state.in_free_string(schema);
        let open_string = state.in_open_string(schema);
        let mut scratch = state.clone();
        let mut read = 0;
        // The depth at which the last token's prefix was refused (past `read`: none).
        let mut refused_at = usize::MAX;
        let mut pattern = state.in_pattern_string(schema).map(PatternWalk::new);
        for entry in &self.vocab.walk {
            let shared = usize::from(entry.shared);
            if let Some(walk) = pattern.as_mut() {
                walk.next_token(shared);
            }
            if refused_at <= shared {
                continue;
            }
            refused_at = usize::MAX;
            let bytes = &self.vocab.text[entry.start as usize..][..usize::from(entry.len)];
            if let (Some(walk), true) = (pattern.as_mut(), entry.plain) {
                // Inside a string held to a pattern, a plain token is the pattern's to judge.
                let fits = u32::from(entry.chars) <= walk.room;
                if let Some(flag) = allowed.get_mut(entry.token as usize) {
                    *flag = walk.accepts(bytes) && fits;
                }
                read = 0;
                continue;
            }
            if let (Some(room), true) = (in_string, entry.plain) {
                if let Some(flag) = allowed.get_mut(entry.token as usize) {
                    *flag = u32::from(entry.chars) <= room;
                }
                read = 0;
                continue;
            }
            if open_string && entry.plain_prefix > 0 {
                // Only what follows its plain prefix needs reading.
                scratch.clone_from(state);
                let accepted = scratch.feed(schema, &bytes[usize::from(entry.plain_prefix)..]);
                if let Some(flag) = allowed.get_mut(entry.token as usize) {
                    *flag = accepted;
                }
                read = 0;
                continue;
            }
            let mut depth = shared.min(read);
            let mut accepted = true;
            while depth < bytes.len() {
                let plain_rest = || match depth {
                    0 => entry.plain,
                    _ => matcher::plain_string_bytes(&bytes[depth..]),
                };
                let fits = |room| matcher::characters(&bytes[depth..]) <= room as usize;
                if states[depth].in_free_string(schema).is_some_and(fits) && plain_rest() {
                    break;
                }
                if states.len() == depth + 1 {
                    states.push(Matcher::dead());
                }
                let (before, after) = states.split_at_mut(depth + 1);
                after[0].clone_from(&before[depth]);
                depth += 1;
                if !after[0].feed(schema, &bytes[depth - 1..depth]) {
                    refused_at = depth;
                    accepted = false;
                    break;
                }
            }
            read = depth;
            if let Some(flag) = allowed.get_mut(entry.token as usize) {
                *flag = accepted;
            }
        }
        // A stop token ends the text: allowed once it is a whole value, never as text.
        let end = state.can_end(schema);
        for &stop in stops {
            if let Some(flag) = allowed.get_mut(stop as usize) {
                *flag = end;
            }
        }
        allowed.iter().filter(|&&flag| flag).count()
    }
}

/// A pattern's automaton walked over the vocabulary in byte order, as the mask walks the
/// matcher: the states after each prefix of the current token are kept, so a token steps only
/// the bytes it does not share with the one before, and a refused prefix refuses the tokens
/// under it.
struct PatternWalk<'p> {
    pattern: &'p Pattern,
    /// Characters the string has room for.
    room: u32,
    /// `states[d]`: after the current token's first `d` bytes, for `d <= read`.
    states: Vec<u32>,
    read: usize,
    /// The current token's first `refused` bytes lead nowhere (`usize::MAX`: not known).
    refused: usize,
}

impl<'p> PatternWalk<'p> {
    fn new((pattern, state, room): (&'p Pattern, u32, u32)) -> Self {
        Self {
            pattern,
            room,
            states: vec![state],
            read: 0,
            refused: usize::MAX,
        }
    }

    /// The next token in byte order shares `shared` bytes with the one before.
    fn next_token(&mut self, shared: usize) {
        self.read = self.read.min(shared);
        if self.refused > shared {
            self.refused = usize::MAX;
        }
    }

    /// Whether the pattern can still match after the current token's `bytes`.
    fn accepts(&mut self, bytes: &[u8]) -> bool {
        if self.refused <= bytes.len() {
            return false;
        }
        while self.read < bytes.len() {
            let next = self.pattern.step(self.states[self.read], bytes[self.read]);
            if next == pattern::DEAD {
                self.refused = self.read + 1;
                return false;
            }
            self.read += 1;
            self.states.truncate(self.read);
            self.states.push(next);
        }
        true
    }
}

#[cfg(test)]
mod tests;
