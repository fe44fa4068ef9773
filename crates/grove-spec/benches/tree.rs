//! Host-side costs of a DDTree round at real sizes: per-depth top-K over a 151936-token row
//! (1 and 4 vocabulary shards), the best-first tree build for growing budgets, and a lookup
//! tree over texts of growing length.
//! `cargo bench -p grove-spec`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use grove_spec::{lookup_tree, top_k_candidates, DraftTree, LookupConfig, NgramCorpus};
use rand::{Rng, SeedableRng};

const VOCAB: usize = 151_936;
const DEPTHS: usize = 15;

fn logits(seed: u64) -> Vec<Vec<f32>> {
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(seed);
    (0..DEPTHS)
        .map(|_| (0..VOCAB).map(|_| rng.random_range(-8.0..8.0)).collect())
        .collect()
}

fn candidates(c: &mut Criterion) {
    let rows = logits(1);
    let mut group = c.benchmark_group("top_k_one_depth");
    for (k, shards) in [(1, 1), (16, 1), (64, 1), (64, 4)] {
        group.bench_with_input(
            BenchmarkId::new(format!("k{k}"), format!("shards{shards}")),
            &(k, shards),
            |b, &(k, shards)| b.iter(|| top_k_candidates(&rows[0], k, shards)),
        );
    }
    group.finish();
}

fn tree_build(c: &mut Criterion) {
    let rows = logits(2);
    let mut group = c.benchmark_group("tree_build");
    for budget in [4usize, 16, 64, 256, 1024] {
        let candidates: Vec<_> = rows
            .iter()
            .map(|row| top_k_candidates(row, budget, 1))
            .collect();
        group.bench_with_input(
            BenchmarkId::from_parameter(budget),
            &budget,
            |b, &budget| b.iter(|| DraftTree::build(0, &candidates, budget)),
        );
    }
    group.finish();
}

/// A lookup tree of 16 nodes at most over a text of `len` tokens from 200 ids (so the last
/// token recurs every 200 tokens or so, and each recurrence is compared), whose last 24 tokens
/// repeat a stretch from its middle.
fn lookup(c: &mut Criterion) {
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(3);
    let mut group = c.benchmark_group("lookup_tree");
    for len in [1_024usize, 8_192, 32_768] {
        let mut history: Vec<u32> = (0..len - 24).map(|_| rng.random_range(0..200)).collect();
        let middle = history[len / 2..len / 2 + 24].to_vec();
        history.extend(middle);
        group.bench_with_input(BenchmarkId::new("tokens", len), &history, |b, history| {
            b.iter(|| lookup_tree(history, &[], LookupConfig::DEFAULT, 16, 16, |_, _| true))
        });
    }
    group.finish();
}

/// The same lookup over a 1k-token text with a full default corpus (a million tokens: 2048
/// texts of 511 tokens from 2000 ids), and what one finished request's text costs to add. The
/// text's last 24 tokens repeat a stretch of a corpus text, so every chain is walked.
fn corpus(c: &mut Criterion) {
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(5);
    let mut group = c.benchmark_group("corpus");
    let mut corpus = NgramCorpus::new(1 << 20, LookupConfig::DEFAULT);
    let texts: Vec<Vec<u32>> = (0..2048)
        .map(|_| (0..511).map(|_| rng.random_range(0..2000)).collect())
        .collect();
    for text in &texts {
        corpus.insert(text);
    }
    let mut history: Vec<u32> = (0..1000).map(|_| rng.random_range(0..2000)).collect();
    history.extend_from_slice(&texts[100][200..224]);
    group.bench_function("lookup_tree_1k_tokens", |b| {
        b.iter(|| {
            lookup_tree(
                &history,
                &[&corpus],
                LookupConfig::DEFAULT,
                16,
                16,
                |_, _| true,
            )
        })
    });
    group.bench_function("insert_511_tokens", |b| {
        let mut next = texts.iter().cycle();
        b.iter(|| corpus.insert(next.next().unwrap()))
    });
    group.finish();
}

criterion_group!(benches, candidates, tree_build, lookup, corpus);
criterion_main!(benches);
