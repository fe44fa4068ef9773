//! The matcher against JSON as serde_json reads it, the mask against reading every token,
//! and masked random walks that always end in a value of the schema.

use std::sync::Arc;

use grove_spec::{top_k_candidates, DepthCandidates, DraftTree};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use serde_json::{json, Value};

use super::*;

fn accepts_whole(schema: &Schema, text: &str) -> bool {
    let mut matcher = Matcher::new(schema);
    matcher.feed(schema, text.as_bytes()) && matcher.can_end(schema)
}

#[test]
fn any_value_is_what_serde_json_reads() {
    let schema = Schema::any_value();
    let texts = [
        "{}",
        "[]",
        "0",
        "-0.5e+10",
        "12",
        "\"a\\u00e9\\n\"",
        "true",
        "null",
        "{\"a\": [1, 2.5, {\"b\": null}], \"c\": \"é\"}",
        " [ 1 , [ ] ]",
        "{\n  \"a\": [\n\t\t1\n  ]\n}",
        "01",
        "1.",
        "-",
        "[1,]",
        "{\"a\" 1}",
        "{\"a\":1,}",
        "\"\\x\"",
        "\"tab\there\"",
        "[1] 2",
        "tru",
        "1e",
        "{,}",
        "\"\\u12g4\"",
    ];
    for text in texts {
        let expected = serde_json::from_str::<Value>(text).is_ok();
        assert_eq!(accepts_whole(&schema, text), expected, "{text:?}");
    }
}

fn person() -> Schema {
    Schema::compile(&json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "exclusiveMaximum": 150},
            "nickname": {"type": ["string", "null"]},
            "role": {"enum": ["admin", "user", 7]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}
        },
        "required": ["name", "age", "role"]
    }))
    .unwrap()
}

#[test]
fn a_schema_holds_types_order_requirements_and_bounds() {
    let schema = person();
    let good = [
        r#"{"name": "Ann", "age": 30, "role": "admin"}"#,
        r#"{"name":"Ann","age":149,"nickname":null,"role":7,"tags":["a","b"]}"#,
        r#"{"name": "Zoë", "age": 0, "nickname": "z", "role": "user", "tags": []}"#,
    ];
    for text in good {
        assert!(accepts_whole(&schema, text), "{text}");
    }
    let bad = [
        r#"{"age": 30, "name": "Ann", "role": "admin"}"#, // out of order
        r#"{"name": "Ann", "role": "admin"}"#,            // age missing
        r#"{"name": "Ann", "age": 3.5, "role": "admin"}"#, // not an integer
        r#"{"name": "", "age": 3, "role": "admin"}"#,     // too short
        r#"{"name": "Annabelle!", "age": 3, "role": "admin"}"#, // too long
        r#"{"name": "Ann", "age": 3, "role": "root"}"#,   // not in the enum
        r#"{"name": "Ann", "age": 3, "role": 7, "tags": ["a","b","c"]}"#, // too many
        r#"{"name": "Ann", "age": 3, "role": 7, "other": 1}"#, // not listed
        r#"{"name": "Ann", "age": 3, "nickname": 5, "role": 7}"#, // wrong type
    ];
    for text in bad {
        assert!(!accepts_whole(&schema, text), "{text}");
    }
}

fn coded() -> Schema {
    Schema::compile(&json!({"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2,4}$"},
        "day": {"type": "string", "format": "date"},
        "note": {"type": "string", "pattern": "ok"}
    }, "required": ["code", "day", "note"]}))
    .unwrap()
}

#[test]
fn patterns_and_formats_hold_on_the_decoded_string() {
    let schema = coded();
    let good = [
        r#"{"code": "AB12", "day": "2026-12-05", "note": "all ok"}"#,
        r#"{"code": "ZZ0000", "day": "1999-01-31", "note": "looks ok to me"}"#,
        // An escape is read as the character it stands for.
        r#"{"code": "AB12", "day": "2026-12-05", "note": "ok\n"}"#,
    ];
    for text in good {
        assert!(accepts_whole(&schema, text), "{text}");
    }
    let bad = [
        r#"{"code": "A12", "day": "2026-12-05", "note": "ok"}"#,
        r#"{"code": "AB12345", "day": "2026-12-05", "note": "ok"}"#,
        r#"{"code": "AB12", "day": "2026-13-05", "note": "ok"}"#,
        r#"{"code": "AB12", "day": "2026-12-05", "note": "no"}"#,
        // No `\u` escapes in a patterned string.
        r#"{"code": "\u0041B12", "day": "2026-12-05", "note": "ok"}"#,
    ];
    for text in bad {
        assert!(!accepts_whole(&schema, text), "{text}");
    }
    // A prefix no continuation can match is refused at once, not at the closing quote.
    let mut state = Matcher::new(&schema);
    assert!(!state.feed(&schema, br#"{"code": "A1"#));
}

#[test]
fn recursion_and_whitespace_limits() {
    let tree = Schema::compile(&json!({
        "$defs": {"node": {"type": "object", "properties": {
            "v": {"type": "integer"},
            "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}
        }, "required": ["v"]}},
        "$ref": "#/$defs/node"
    }))
    .unwrap();
    assert!(accepts_whole(
        &tree,
        r#"{"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4}]}]}"#
    ));
    assert!(!accepts_whole(&tree, r#"{"v":1,"kids":[{"w":2}]}"#));
    let any = Schema::any_value();
    let indented = format!("[\n{}1]", " ".repeat(MAX_INDENT as usize));
    assert!(accepts_whole(&any, &indented));
    let too_indented = format!("[\n{}1]", " ".repeat(MAX_INDENT as usize + 1));
    assert!(!accepts_whole(&any, &too_indented));
    // One space, or a newline and indentation: no runs of spaces, no blank lines.
    for wasteful in ["[  1]", "[\n\n1]", "[ \n1]", "\n\n{}", "[1\r\n]"] {
        assert!(!accepts_whole(&any, wasteful), "{wasteful:?}");
    }
    let deep = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert!(accepts_whole(&any, &deep));
    let too_deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    assert!(!accepts_whole(&any, &too_deep));
    let looped = Schema::compile(&json!({"anyOf": [{"$ref": "#"}]}));
    assert!(looped.is_err());
}

/// A vocabulary of JSON-ish fragments: 0 is special, 1 the stop token.
fn vocab() -> Arc<TokenBytes> {
    Arc::new(TokenBytes::new(vocab_bytes()))
}

fn vocab_bytes() -> Vec<Option<Vec<u8>>> {
    let mut bytes: Vec<Option<Vec<u8>>> = vec![None, None];
    for byte in 0x20..0x7f_u8 {
        bytes.push(Some(vec![byte]));
    }
    let fragments = [
        "{\"",
        "\":",
        "\": \"",
        "\",",
        "\"}",
        "\"]",
        "name",
        "\"name\"",
        "\"age\"",
        "role",
        "admin",
        "user",
        "true",
        "null",
        "12",
        ".5",
        "e-",
        "\n  ",
        "\n",
        "\\u00",
        "e9",
        "\\n",
        "\\\"",
        ", \"",
        "[{",
        "}]",
        "é",
        "Zo",
        "ë",
        "\u{00c3}",
        "\"ad",
        "min\"",
        "7,",
        "7}",
        "  ",
        "\"tags\": [",
        "\"nickname\"",
        "\t",
        "\u{1}",
    ];
    for fragment in fragments {
        bytes.push(Some(fragment.as_bytes().to_vec()));
    }
    // A split UTF-8 character: its two bytes as two tokens.
    bytes.push(Some(vec![0xc3]));
    bytes.push(Some(vec![0xab]));
    bytes
}

const STOP: TokenId = 1;

#[test]
fn the_mask_is_reading_every_token() {
    let vocab = vocab();
    for schema in [person(), coded(), Schema::any_object(), Schema::any_value()] {
        let grammar = Grammar::new(schema, Arc::clone(&vocab));
        let mut rng = ChaCha12Rng::seed_from_u64(3);
        let mut allowed = vec![false; vocab.len() + 3];
        for _ in 0..20 {
            let mut state = grammar.start();
            for _ in 0..60 {
                let count = grammar.mask(&state, &[STOP], &mut allowed);
                for token in 0..allowed.len() as TokenId {
                    assert_eq!(
                        allowed[token as usize],
                        grammar.allows(&state, token, &[STOP]),
                        "token {token} ({:?}) in {state:?}",
                        vocab.get(token).map(String::from_utf8_lossy)
                    );
                }
                let choices: Vec<TokenId> = (0..allowed.len() as TokenId)
                    .filter(|&t| allowed[t as usize])
                    .collect();
                assert_eq!(choices.len(), count);
                assert!(count > 0, "a dead end in {state:?}");
                let token = choices[rng.random_range(0..choices.len())];
                if token == STOP {
                    break;
                }
                grammar.advance(&mut state, token);
                assert!(!state.is_dead());
            }
        }
    }
}

#[test]
fn masked_walks_end_in_values_of_the_schema() {
    let vocab = vocab();
    let grammar = Grammar::new(person(), Arc::clone(&vocab));
    let mut rng = ChaCha12Rng::seed_from_u64(11);
    let mut allowed = vec![false; vocab.len()];
    let mut ended = 0;
    for _ in 0..200 {
        let mut state = grammar.start();
        let mut text = Vec::new();
        for _ in 0..400 {
            grammar.mask(&state, &[STOP], &mut allowed);
            if allowed[STOP as usize] {
                let value: Value = serde_json::from_slice(&text).expect("a whole value");
                let object = value.as_object().expect("an object");
                assert!(["name", "age", "role"]
                    .iter()
                    .all(|k| object.contains_key(*k)));
                // `-0` is an integer that serde_json reads as a float.
                let age = object["age"].as_f64().expect("a number");
                assert!(age.fract() == 0.0 && (0.0..150.0).contains(&age), "{value}");
                ended += 1;
                break;
            }
            // Closing bytes are likelier, so that walks end.
            let choices: Vec<TokenId> = (0..allowed.len() as TokenId)
                .filter(|&t| allowed[t as usize])
                .collect();
            let closing = choices
                .iter()
                .copied()
                .filter(|&t| matches!(vocab.get(t), Some(b"\"" | b"}" | b"]" | b",")))
                .collect::<Vec<_>>();
            let pool = if !closing.is_empty() && rng.random_bool(0.4) {
                &closing
            } else {
                &choices
            };
            let token = pool[rng.random_range(0..pool.len())];
            text.extend_from_slice(vocab.get(token).unwrap());
            grammar.advance(&mut state, token);
        }
    }
    assert!(ended > 100, "only {ended} of 200 walks ended");
}

/// Random per-depth candidates over the whole of `vocab`, best first.
fn random_candidates(
    rng: &mut ChaCha12Rng,
    depths: usize,
    vocab: usize,
    k: usize,
) -> Vec<DepthCandidates> {
    (0..depths)
        .map(|_| {
            let logits: Vec<f32> = (0..vocab).map(|_| rng.random_range(-4.0..4.0)).collect();
            top_k_candidates(&logits, k, 1)
        })
        .collect()
}

#[test]
fn a_draft_tree_under_a_schema_holds_only_drafts_it_allows_after_their_paths() {
    let vocab = vocab();
    let grammar = Grammar::new(person(), Arc::clone(&vocab));
    let mut rng = ChaCha12Rng::seed_from_u64(5);
    let mut state = grammar.start();
    let mut refused = 0;
    for step in 0..40 {
        let candidates = random_candidates(&mut rng, 5, vocab.len(), vocab.len());
        let tree = DraftTree::build_where(0, &candidates, 16, grammar.admission(&state, &[STOP]));
        let everything = DraftTree::build(0, &candidates, 16);
        for node in 1..tree.tokens.len() {
            let mut at = state.clone();
            let path = tree.path(node);
            let (last, before) = path.split_last().unwrap();
            for &token in before {
                assert!(grammar.allows(&at, token, &[STOP]));
                grammar.advance(&mut at, token);
            }
            assert!(
                grammar.allows(&at, *last, &[STOP]),
                "step {step} node {node}"
            );
        }
        // Every admitted prefix the full tree holds is in the schema's tree too, up to the
        // budget: refused drafts take no room.
        let admitted = (1..everything.tokens.len())
            .filter(|&n| {
                let mut at = state.clone();
                everything.path(n).iter().all(|&t| {
                    let ok = grammar.allows(&at, t, &[STOP]);
                    grammar.advance(&mut at, t);
                    ok
                })
            })
            .count();
        assert!(tree.len() >= admitted, "step {step}");
        refused += everything.len() - admitted;
        // A chain takes each depth's best allowed draft.
        let chain = DraftTree::chain_where(0, &candidates, grammar.admission(&state, &[STOP]));
        if let Some(&first) = chain.tokens.get(1) {
            let best = candidates[0]
                .token_ids
                .iter()
                .find(|&&t| grammar.allows(&state, t, &[STOP]));
            assert_eq!(Some(&first), best);
        }
        // Move on along the tree's first draft, as the walk would if the target chose it.
        let Some(&next) = tree.tokens.get(1) else {
            break;
        };
        if next == STOP {
            break;
        }
        grammar.advance(&mut state, next);
    }
    assert!(refused > 100, "the schema refused only {refused} drafts");
}

#[test]
fn a_reasoning_block_comes_before_the_schema_and_is_not_held_by_it() {
    let mut bytes = vocab_bytes();
    let (open, close) = (bytes.len() as TokenId, bytes.len() as TokenId + 1);
    bytes.extend([None, None]);
    let vocab = Arc::new(TokenBytes::new(bytes));
    let token = |text: &str| {
        (0..vocab.len() as TokenId)
            .find(|&t| vocab.get(t) == Some(text.as_bytes()))
            .unwrap()
    };
    let (brace, word) = (token("{\""), token("admin"));
    let mut allowed = vec![false; vocab.len()];
    let check_mask = |grammar: &Grammar, state: &Matcher, allowed: &mut Vec<bool>| {
        let count = grammar.mask(state, &[STOP], allowed);
        for t in 0..vocab.len() as TokenId {
            assert_eq!(
                allowed[t as usize],
                grammar.allows(state, t, &[STOP]),
                "token {t}"
            );
        }
        assert_eq!(count, allowed.iter().filter(|&&a| a).count());
    };
    // Qwen3: the text may open a block; inside it anything but a stop token.
    let hybrid = Grammar::new(person(), Arc::clone(&vocab)).after_reasoning(ReasoningTokens {
        open: Some(open),
        close,
    });
    let start = hybrid.start();
    check_mask(&hybrid, &start, &mut allowed);
    assert!(hybrid.allows(&start, open, &[STOP]) && hybrid.allows(&start, brace, &[STOP]));
    assert!(!hybrid.allows(&start, word, &[STOP]) && !hybrid.allows(&start, close, &[STOP]));
    let mut thinking = hybrid.after(&start, open, &[STOP]).unwrap();
    check_mask(&hybrid, &thinking, &mut allowed);
    assert_eq!(allowed.iter().filter(|&&a| a).count(), vocab.len() - 1);
    assert!(!allowed[STOP as usize]);
    for t in [word, open, token("}]"), brace] {
        hybrid.advance(&mut thinking, t);
        assert!(hybrid.allows(&thinking, close, &[STOP]));
    }
    // Closed: the schema from its start, as if nothing came before.
    hybrid.advance(&mut thinking, close);
    let plain = Grammar::new(person(), Arc::clone(&vocab));
    let mut expected = vec![false; vocab.len()];
    plain.mask(&plain.start(), &[STOP], &mut expected);
    check_mask(&hybrid, &thinking, &mut allowed);
    assert_eq!(allowed, expected);
    // No block opened: the schema holds from the first token, and none opens later.
    let answering = hybrid.after(&start, brace, &[STOP]).unwrap();
    assert!(!hybrid.allows(&answering, open, &[STOP]));
    check_mask(&hybrid, &answering, &mut allowed);
    // DeepSeek-R1: the text starts inside the block.
    let opened = Grammar::new(person(), Arc::clone(&vocab))
        .after_reasoning(ReasoningTokens { open: None, close });
    let mut state = opened.start();
    assert!(opened.allows(&state, word, &[STOP]) && !opened.allows(&state, STOP, &[STOP]));
    opened.advance(&mut state, word);
    opened.advance(&mut state, close);
    check_mask(&opened, &state, &mut allowed);
    assert_eq!(allowed, expected);
    // A draft tree follows the block through its paths.
    let candidates = vec![
        DepthCandidates {
            token_ids: vec![open, brace, word],
            log_probs: vec![-0.1, -1.0, -2.0],
        },
        DepthCandidates {
            token_ids: vec![word, close],
            log_probs: vec![-0.1, -1.0],
        },
        DepthCandidates {
            token_ids: vec![close, brace],
            log_probs: vec![-0.1, -1.0],
        },
    ];
    let tree = DraftTree::build_where(0, &candidates, 16, hybrid.admission(&start, &[STOP]));
    let paths: Vec<Vec<TokenId>> = (1..tree.tokens.len()).map(|n| tree.path(n)).collect();
    assert!(paths.contains(&vec![open, word, close]) && paths.contains(&vec![open, close, brace]));
    assert!(!paths.iter().any(|p| p[0] == word), "{paths:?}");
    assert!(!paths.contains(&vec![brace, word]), "{paths:?}");
}
