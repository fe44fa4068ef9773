//! A string's `pattern` (or `format`, as the pattern it stands for), read a byte at a time: a
//! DFA built once per schema by `regex-automata`, stepped on the string's characters as JSON
//! decodes them. JSON Schema's patterns search (`"a"` matches `"cat"`), so the DFA runs
//! `.*(?:pattern).*` anchored at the start; the string may close only where that matches.
//! Patterns are Rust regex syntax, which agrees with ECMA-262's on what schemas use (classes,
//! repetition, anchors, alternation); `\d` and `\w` are Unicode-aware here.

use std::collections::HashMap;

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::Anchored;

/// The largest DFA one pattern may build, in bytes (a bound on one request's memory and
/// compile time).
const MAX_DFA_BYTES: usize = 4 << 20;

/// The most states a pattern's automaton may have (its table takes 1 KiB a state).
const MAX_STATES: usize = 4096;

/// No text from here matches.
pub(crate) const DEAD: u32 = u32::MAX;

/// A compiled pattern: the DFA's states from which some text still matches, renumbered from
/// 0 (the start), with a full byte table. The DFA's own dead state is not enough: in
/// `.*(?:^a).*`, after `b` the leading `.*` is alive but `^` can never hold again, and a
/// string in such a state could never close.
pub(crate) struct Pattern {
    source: String,
    /// `next[state * 256 + byte]`: the state after `byte`, or [`DEAD`].
    next: Vec<u32>,
    /// The text may end in this state.
    ends: Vec<bool>,
}

impl std::fmt::Debug for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pattern({:?}, {} states)", self.source, self.ends.len())
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

/// What `format` stands for, as a pattern (RFC 3339 dates and times, UUIDs, IPv4 addresses,
/// and e-mail addresses as people write them, a subset of RFC 5321's).
pub(crate) fn format_pattern(format: &str) -> Option<String> {
    const DATE: &str = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
    const TIME: &str = "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?\
                        ([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
    const OCTET: &str = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
    const HEX: &str = "[0-9a-fA-F]";
    Some(match format {
        "date" => format!("^{DATE}$"),
        "time" => format!("^{TIME}$"),
        "date-time" => format!("^{DATE}[Tt]{TIME}$"),
        "uuid" => format!("^{HEX}{{8}}-{HEX}{{4}}-{HEX}{{4}}-{HEX}{{4}}-{HEX}{{12}}$"),
        "ipv4" => format!("^({OCTET}\\.){{3}}{OCTET}$"),
        "email" => "^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)+$".to_owned(),
        _ => return None,
    })
}

impl Pattern {
    /// Compiles `source`; the error says why it cannot be used.
    pub fn new(source: &str) -> Result<Self, String> {
        let fail = |e: &dyn std::fmt::Display| format!("pattern `{source}`: {e}");
        let searching = format!("(?s:.*)(?:{source})(?s:.*)");
        let dfa = dense::Builder::new()
            .configure(
                dense::DFA::config()
                    .start_kind(StartKind::Anchored)
                    .dfa_size_limit(Some(MAX_DFA_BYTES))
                    .determinize_size_limit(Some(MAX_DFA_BYTES)),
            )
            .build(&searching)
            .map_err(|e| fail(&e))?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| fail(&e))?;
        let (states, edges) = reachable(&dfa, start).map_err(|e| fail(&e))?;
        let live = live(&dfa, &states, &edges);
        if !live[0] {
            return Err(fail(&"no string matches it"));
        }
        // Live states renumbered in order; the start stays 0.
        let mut number = vec![DEAD; states.len()];
        let mut count = 0;
        for (index, &alive) in live.iter().enumerate() {
            if alive {
                number[index] = count;
                count += 1;
            }
        }
        let mut next = Vec::with_capacity(count as usize * 256);
        let mut ends = Vec::with_capacity(count as usize);
        for (index, state) in states.iter().enumerate() {
            if live[index] {
                next.extend(edges[index].iter().map(|&to| number[to]));
                ends.push(dfa.is_match_state(dfa.next_eoi_state(*state)));
            }
        }
        Ok(Self {
            source: source.to_owned(),
            next,
            ends,
        })
    }

    /// The state before the string's first character.
    pub fn start(&self) -> u32 {
        0
    }

    /// The state after `byte`, or [`DEAD`].
    pub fn step(&self, state: u32, byte: u8) -> u32 {
        self.next[state as usize * 256 + usize::from(byte)]
    }

    /// The state after `bytes` (decoded string content), or `None` once no text can match.
    pub fn next(&self, mut state: u32, bytes: &[u8]) -> Option<u32> {
        for &byte in bytes {
            state = self.step(state, byte);
            if state == DEAD {
                return None;
            }
        }
        Some(state)
    }

    /// Whether the string may end in `state`.
    pub fn matches(&self, state: u32) -> bool {
        self.ends[state as usize]
    }
}

/// The DFA's states reachable from `start` (`start` first) and each one's 256 successors, by
/// index into that list.
fn reachable(
    dfa: &dense::DFA<Vec<u32>>,
    start: StateID,
) -> Result<(Vec<StateID>, Vec<Vec<usize>>), String> {
    let mut index: HashMap<StateID, usize> = HashMap::from([(start, 0)]);
    let mut states = vec![start];
    let mut edges = Vec::new();
    while edges.len() < states.len() {
        let state = states[edges.len()];
        let mut next = Vec::with_capacity(256);
        for byte in 0..=255u8 {
            let to = dfa.next_state(state, byte);
            let count = index.len();
            let at = *index.entry(to).or_insert(count);
            if at == states.len() {
                if states.len() >= MAX_STATES {
                    return Err(format!("more than {MAX_STATES} states"));
                }
                states.push(to);
            }
            next.push(at);
        }
        edges.push(next);
    }
    Ok((states, edges))
}

/// Which states lead to one where the text may end: from those, the transitions walked
/// backwards.
fn live(dfa: &dense::DFA<Vec<u32>>, states: &[StateID], edges: &[Vec<usize>]) -> Vec<bool> {
    let mut into: Vec<Vec<usize>> = vec![Vec::new(); states.len()];
    for (from, next) in edges.iter().enumerate() {
        for &to in next {
            into[to].push(from);
        }
    }
    let mut live: Vec<bool> = states
        .iter()
        .map(|&s| dfa.is_match_state(dfa.next_eoi_state(s)))
        .collect();
    let mut queue: Vec<usize> = (0..states.len()).filter(|&s| live[s]).collect();
    while let Some(state) = queue.pop() {
        for &from in &into[state] {
            if !live[from] {
                live[from] = true;
                queue.push(from);
            }
        }
    }
    live
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(pattern: &Pattern, text: &str) -> bool {
        pattern
            .next(pattern.start(), text.as_bytes())
            .is_some_and(|s| pattern.matches(s))
    }

    #[test]
    fn patterns_search_and_anchors_hold() {
        let digits = Pattern::new("^[0-9]+$").unwrap();
        assert!(full(&digits, "2026") && !full(&digits, "20x6") && !full(&digits, ""));
        // A prefix that no continuation can match is refused at once.
        assert!(digits.next(digits.start(), b"2x").is_none());
        let contains = Pattern::new("cat").unwrap();
        assert!(full(&contains, "concatenate") && !full(&contains, "dog"));
        assert!(Pattern::new("(").is_err());
        // Anchored at the start: a wrong first character can never be made good.
        let anchored = Pattern::new("^ab").unwrap();
        assert!(anchored.next(anchored.start(), b"b").is_none());
        assert!(full(&anchored, "abc"));
    }

    #[test]
    fn formats_are_their_patterns() {
        let check = |format: &str, good: &str, bad: &str| {
            let pattern = Pattern::new(&format_pattern(format).unwrap()).unwrap();
            assert!(full(&pattern, good), "{format}: {good}");
            assert!(!full(&pattern, bad), "{format}: {bad}");
        };
        check("date", "2026-12-05", "2026-13-05");
        check("date-time", "2026-12-05T14:03:00.5Z", "2026-12-05 14:03");
        check("time", "23:59:60+01:00", "24:00:00Z");
        check(
            "uuid",
            "123e4567-e89b-12d3-a456-426614174000",
            "123e4567e89b12d3",
        );
        check("ipv4", "192.168.0.255", "256.1.1.1");
        check("email", "ada.lovelace@example.org", "ada@localhost");
        assert!(format_pattern("hostname").is_none());
    }
}
