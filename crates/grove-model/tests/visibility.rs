//! The forward contract's visibility rules and paged KV, on seeded random checkpoints of every
//! supported family: a tree row's logits equal those of running its ancestor path causally; a
//! chain-shaped tree is byte-identical to causal rows; bidirectional rows see later rows;
//! batching segments and the page size change nothing.

use std::path::Path;

use anyhow::Result;
use candle_core::Device;
use grove_kv::{KvStore, PagePool, PageTable};
use grove_model::{Decoder, Family, ForwardBatch, LogitRows, Model, Segment, Visibility};
use grove_testkit::random_checkpoint::RandomCheckpoint;

const TOLERANCE: f32 = 1e-4;

fn checkpoint(family: Family, tied: bool, bf16: bool) -> RandomCheckpoint {
    RandomCheckpoint {
        family,
        vocab_size: 96,
        hidden_size: 64,
        intermediate_size: 128,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 16,
        tie_word_embeddings: tied,
        bf16,
        with_tokenizer: false,
        max_position_embeddings: 512,
        seed: 7,
    }
}

fn load(spec: &RandomCheckpoint, dir: &Path) -> Result<Decoder> {
    spec.write(dir)?;
    Ok(Decoder::load(dir, &Device::Cpu)?)
}

fn every_family() -> Vec<RandomCheckpoint> {
    vec![
        checkpoint(Family::Qwen3, false, false),
        checkpoint(Family::Qwen2, true, true),
        checkpoint(Family::Llama, false, true),
    ]
}

/// Runs `tokens` causally after the table's committed tokens; returns all rows' logits.
fn causal_logits(
    model: &Decoder,
    table: &mut PageTable,
    kv: &mut KvStore,
    tokens: &[u32],
) -> Result<Vec<Vec<f32>>> {
    table.reserve(tokens.len())?;
    let positions: Vec<usize> = (table.len()..table.len() + tokens.len()).collect();
    let batch = ForwardBatch {
        segments: vec![Segment::causal(table, tokens, &positions, LogitRows::All)],
        taps: &[],
    };
    let output = model.forward(&batch, kv)?;
    table.append(tokens.len());
    Ok((0..tokens.len())
        .map(|i| output.logits_row(i))
        .collect::<candle_core::Result<_>>()?)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn tree_row_logits_equal_their_ancestor_path_run_causally() -> Result<()> {
    let context: Vec<u32> = vec![5, 17, 42, 8, 23, 61, 2];
    // Root 0; children 1, 2 of the root; 3 under 1; 4 under 3; 5 under 2; 6 under 1.
    let parents = vec![None, Some(0), Some(0), Some(1), Some(3), Some(2), Some(1)];
    let tokens: Vec<u32> = vec![11, 30, 31, 40, 50, 60, 41];
    for spec in every_family() {
        let dir = tempfile::tempdir()?;
        let model = load(&spec, dir.path())?;
        let pool = PagePool::new(64, 4)?;
        let mut kv = model.new_kv_store(pool.num_slots());
        let mut table = pool.new_table();
        causal_logits(&model, &mut table, &mut kv, &context)?;

        let depth = |mut node: usize| {
            let mut d = 0;
            while let Some(p) = parents[node] {
                node = p;
                d += 1;
            }
            d
        };
        let positions: Vec<usize> = (0..tokens.len())
            .map(|i| context.len() + depth(i))
            .collect();
        table.reserve(tokens.len())?;
        let segment = Segment {
            table: &table,
            context_len: table.len(),
            tokens: &tokens,
            positions: &positions,
            visibility: Visibility::Tree {
                parents: parents.clone(),
            },
            logits: LogitRows::All,
        };
        let tree = model.forward(
            &ForwardBatch {
                segments: vec![segment],
                taps: &[],
            },
            &mut kv,
        )?;

        for node in 0..tokens.len() {
            let mut path = vec![node];
            while let Some(p) = parents[*path.last().unwrap()] {
                path.push(p);
            }
            path.reverse();
            let path_tokens: Vec<u32> = path.iter().map(|&i| tokens[i]).collect();
            let fresh_pool = PagePool::new(64, 1)?;
            let mut fresh_kv = model.new_kv_store(fresh_pool.num_slots());
            let mut fresh = fresh_pool.new_table();
            causal_logits(&model, &mut fresh, &mut fresh_kv, &context)?;
            let chain = causal_logits(&model, &mut fresh, &mut fresh_kv, &path_tokens)?;
            let diff = max_diff(&tree.logits_row(node)?, chain.last().unwrap());
            assert!(
                diff < TOLERANCE,
                "{:?} node {node}: tree vs causal path differ by {diff}",
                spec.family
            );
        }
    }
    Ok(())
}

#[test]
fn chain_shaped_tree_is_byte_identical_to_causal_and_a_hidden_key_changes_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let model = load(&checkpoint(Family::Qwen3, false, false), dir.path())?;
    // A short context, and one long enough that attention cuts each row's keys into pieces.
    for context_len in [4, 300] {
        chain_and_cuts(&model, context_len)?;
    }
    Ok(())
}

fn chain_and_cuts(model: &Decoder, context_len: usize) -> Result<()> {
    let context: Vec<u32> = (0..context_len as u32).map(|i| (3 + 7 * i) % 96).collect();
    let tokens: Vec<u32> = vec![10, 20, 30, 40];
    let run = |visibility: Visibility| -> Result<Vec<Vec<f32>>> {
        let pool = PagePool::new(context_len + 16, 1)?;
        let mut kv = model.new_kv_store(pool.num_slots());
        let mut table = pool.new_table();
        causal_logits(model, &mut table, &mut kv, &context)?;
        table.reserve(tokens.len())?;
        let positions: Vec<usize> = (context_len..context_len + 4).collect();
        let segment = Segment {
            table: &table,
            context_len,
            tokens: &tokens,
            positions: &positions,
            visibility,
            logits: LogitRows::All,
        };
        let output = model.forward(
            &ForwardBatch {
                segments: vec![segment],
                taps: &[],
            },
            &mut kv,
        )?;
        Ok((0..4)
            .map(|i| output.logits_row(i))
            .collect::<candle_core::Result<_>>()?)
    };
    let causal = run(Visibility::Causal)?;
    let chain = run(Visibility::Tree {
        parents: vec![None, Some(0), Some(1), Some(2)],
    })?;
    assert_eq!(causal, chain, "context {context_len}");
    // Row 3 with parent 1 instead of 2 no longer sees row 2: its logits must change.
    let cut = run(Visibility::Tree {
        parents: vec![None, Some(0), Some(1), Some(1)],
    })?;
    assert_eq!(cut[2], causal[2]);
    let changed = max_diff(&cut[3], &causal[3]);
    assert!(
        changed > 1e-5,
        "hiding a key changed the logits by only {changed}"
    );
    // Bidirectional: the first row sees the later ones.
    let bidirectional = run(Visibility::Bidirectional)?;
    let changed = max_diff(&bidirectional[0], &causal[0]);
    assert!(
        changed > 1e-5,
        "seeing later rows changed row 0 by only {changed}"
    );
    Ok(())
}

#[test]
fn batching_segments_and_page_size_change_nothing() -> Result<()> {
    for spec in every_family() {
        let dir = tempfile::tempdir()?;
        let model = load(&spec, dir.path())?;
        let first: Vec<u32> = vec![1, 2, 3, 4, 5, 6, 7, 8, 9];
        let second: Vec<u32> = vec![90, 80, 70];
        // Each alone, page size 1, fed token by token (decode) after a 1-token prefill.
        let mut alone = Vec::new();
        for tokens in [&first, &second] {
            let pool = PagePool::new(32, 1)?;
            let mut kv = model.new_kv_store(pool.num_slots());
            let mut table = pool.new_table();
            let mut rows = Vec::new();
            for token in tokens.iter() {
                rows.extend(causal_logits(&model, &mut table, &mut kv, &[*token])?);
            }
            alone.push(rows);
        }
        // Both in one batch, page size 4, prefilled at once.
        let pool = PagePool::new(16, 4)?;
        let mut kv = model.new_kv_store(pool.num_slots());
        let (mut table_a, mut table_b) = (pool.new_table(), pool.new_table());
        table_a.reserve(first.len())?;
        table_b.reserve(second.len())?;
        let positions_a: Vec<usize> = (0..first.len()).collect();
        let positions_b: Vec<usize> = (0..second.len()).collect();
        let batch = ForwardBatch {
            segments: vec![
                Segment::causal(&table_a, &first, &positions_a, LogitRows::All),
                Segment::causal(&table_b, &second, &positions_b, LogitRows::Some(vec![2, 0])),
            ],
            taps: &[1],
        };
        let output = model.forward(&batch, &mut kv)?;
        assert_eq!(
            output.taps[0].dims(),
            &[first.len() + second.len(), spec.hidden_size]
        );
        for (i, expected) in alone[0].iter().enumerate() {
            let diff = max_diff(&output.logits_row(i)?, expected);
            assert!(diff < TOLERANCE, "{:?} row {i}: {diff}", spec.family);
        }
        let n = first.len();
        assert!(max_diff(&output.logits_row(n)?, &alone[1][2]) < TOLERANCE);
        assert!(max_diff(&output.logits_row(n + 1)?, &alone[1][0]) < TOLERANCE);
    }
    Ok(())
}

#[test]
fn bad_batches_are_rejected_with_a_reason() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let model = load(&checkpoint(Family::Qwen3, false, false), dir.path())?;
    let pool = PagePool::new(4, 1)?;
    let mut kv = model.new_kv_store(pool.num_slots());
    let mut table = pool.new_table();
    table.reserve(2)?;
    let tokens = [1u32, 2, 3];
    let positions = [0usize, 1, 2];
    let batch = ForwardBatch {
        segments: vec![Segment::causal(
            &table,
            &tokens,
            &positions,
            LogitRows::Last,
        )],
        taps: &[],
    };
    let error = model.forward(&batch, &mut kv).unwrap_err().to_string();
    assert!(error.contains("reserved"), "{error}");
    let out_of_vocab = [500u32];
    let batch = ForwardBatch {
        segments: vec![Segment::causal(
            &table,
            &out_of_vocab,
            &positions[..1],
            LogitRows::Last,
        )],
        taps: &[],
    };
    assert!(model
        .forward(&batch, &mut kv)
        .unwrap_err()
        .to_string()
        .contains("vocabulary"));
    let batch = ForwardBatch {
        segments: vec![Segment::causal(
            &table,
            &tokens[..1],
            &positions[..1],
            LogitRows::Last,
        )],
        taps: &[9],
    };
    assert!(model
        .forward(&batch, &mut kv)
        .unwrap_err()
        .to_string()
        .contains("tap layer 9"));
    Ok(())
}

#[test]
fn decoding_after_a_committed_tree_path_equals_a_fresh_prefill() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let model = load(&checkpoint(Family::Qwen3, false, false), dir.path())?;
    let context: Vec<u32> = vec![4, 8, 15, 16, 23];
    let parents = vec![None, Some(0), Some(0), Some(2), Some(1), Some(3)];
    let depths = [0usize, 1, 1, 2, 2, 3];
    let tokens: Vec<u32> = vec![42, 7, 9, 11, 13, 17];
    let path = [0usize, 2, 3, 5]; // root -> 2 -> 3 -> 5, not a chain prefix
    let next = 29u32;
    for page_size in [1, 3, 16] {
        let pool = PagePool::new(64, page_size)?;
        let mut kv = model.new_kv_store(pool.num_slots());
        let mut table = pool.new_table();
        causal_logits(&model, &mut table, &mut kv, &context)?;
        let base = table.len();
        table.reserve(tokens.len())?;
        let positions: Vec<usize> = depths.iter().map(|d| base + d).collect();
        let segment = Segment {
            table: &table,
            context_len: base,
            tokens: &tokens,
            positions: &positions,
            visibility: Visibility::Tree {
                parents: parents.clone(),
            },
            logits: LogitRows::None,
        };
        model.forward(
            &ForwardBatch {
                segments: vec![segment],
                taps: &[],
            },
            &mut kv,
        )?;
        table.commit_path(&mut kv, base, &path);
        let after = causal_logits(&model, &mut table, &mut kv, &[next])?;

        let committed: Vec<u32> = context
            .iter()
            .copied()
            .chain(path.iter().map(|&n| tokens[n]))
            .chain([next])
            .collect();
        let fresh_pool = PagePool::new(64, 1)?;
        let mut fresh_kv = model.new_kv_store(fresh_pool.num_slots());
        let mut fresh = fresh_pool.new_table();
        let expected = causal_logits(&model, &mut fresh, &mut fresh_kv, &committed)?;
        let diff = max_diff(&after[0], expected.last().unwrap());
        assert!(diff < TOLERANCE, "page size {page_size}: {diff}");
        assert_eq!(
            pool.free_pages(),
            64 - pool.pages_for(context.len() + path.len() + 1)
        );
    }
    Ok(())
}
