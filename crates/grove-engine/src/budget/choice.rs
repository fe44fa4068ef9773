//! The choice itself, as pure functions of costs and predictions: which sequences draft this
//! round, and how many of each drafted tree's nodes are verified. Both admit in order of value
//! while the round's expected throughput (tokens / seconds) rises and stop at the first drop
//! (DSpark's rule), so the choice never depends on candidates not built.

/// A sequence that may draft this round, as the plan sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DraftOption {
    /// Expected accepted drafts of its recent drafted rounds.
    pub value: f64,
    /// Draft nodes its recent drafted rounds verified.
    pub rows: f64,
    /// It drafts whatever the costs say (a fixed budget, or time to look again).
    pub forced: bool,
}

/// Which of `options` draft: the forced ones, then the others by value while the predicted
/// throughput rises. `sequences` is the batch size (every sequence emits at least one token
/// and verifies its root); `seconds(drafting, rows)` predicts a round's time.
pub(crate) fn choose_drafting(
    sequences: usize,
    options: &[Option<DraftOption>],
    seconds: impl Fn(usize, f64) -> f64,
) -> Vec<bool> {
    let mut chosen: Vec<bool> = options
        .iter()
        .map(|o| o.is_some_and(|o| o.forced))
        .collect();
    let (mut tokens, mut rows, mut drafting) = (sequences as f64, sequences as f64, 0);
    for option in options.iter().flatten().filter(|o| o.forced) {
        tokens += option.value;
        rows += option.rows;
        drafting += 1;
    }
    let mut rate = tokens / seconds(drafting, rows);
    let mut order: Vec<usize> = (0..options.len())
        .filter(|&i| options[i].is_some_and(|o| !o.forced))
        .collect();
    order.sort_by(|&a, &b| {
        let value = |i: usize| options[i].map_or(0.0, |o| o.value);
        value(b).total_cmp(&value(a)).then(a.cmp(&b))
    });
    for i in order {
        let option = options[i].expect("filtered");
        let next = (tokens + option.value) / seconds(drafting + 1, rows + option.rows);
        if next.is_nan() || next <= rate {
            break;
        }
        (tokens, rows, drafting, rate) = (
            tokens + option.value,
            rows + option.rows,
            drafting + 1,
            next,
        );
        chosen[i] = true;
    }
    chosen
}

/// Nodes of each tree to verify. `gains[s]` are sequence `s`'s nodes' calibrated acceptance
/// probabilities in node order (empty: it has nothing to choose); `fixed_rows` and
/// `fixed_tokens` are the rows and expected tokens the round has whatever is chosen (roots,
/// fixed-budget trees). Nodes are admitted best first across the batch, each sequence's in
/// its own order (so every choice is a prefix: a valid tree), while `seconds(rows)` of the
/// round makes the expected throughput rise.
/// With `explore`, the node at the first drop is admitted too: the row count past the choice
/// gets measured now and then, so a cell measured too slow once (a busy moment) is corrected.
pub(crate) fn choose_nodes(
    gains: &[&[f64]],
    fixed_rows: usize,
    fixed_tokens: f64,
    seconds: impl Fn(usize) -> f64,
    explore: bool,
) -> Vec<usize> {
    let mut taken = vec![0; gains.len()];
    let (mut tokens, mut rows) = (fixed_tokens, fixed_rows);
    let mut rate = tokens / seconds(rows);
    loop {
        let best = (0..gains.len())
            .filter(|&s| taken[s] < gains[s].len())
            .max_by(|&a, &b| {
                gains[a][taken[a]]
                    .total_cmp(&gains[b][taken[b]])
                    .then(b.cmp(&a))
            });
        let Some(s) = best else {
            break;
        };
        let gain = gains[s][taken[s]];
        let next = (tokens + gain) / seconds(rows + 1);
        if next.is_nan() || next <= rate {
            if explore && gain > 0.0 {
                taken[s] += 1;
            }
            break;
        }
        (tokens, rows, rate) = (tokens + gain, rows + 1, next);
        taken[s] += 1;
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_added_while_they_pay_for_their_row() {
        // A row costs 1 + 0.25 per extra row: worth it while its gain beats the current rate
        // times 0.25.
        let cost = |rows: usize| 1.0 + 0.25 * (rows - 1) as f64;
        let gains = [0.9, 0.8, 0.5, 0.3, 0.1];
        let taken = choose_nodes(&[&gains], 1, 1.0, cost, false);
        // Rates: 1, 1.52, 1.80, 1.84, (1.85, 2.0 rows... ) check by brute force.
        let rate = |b: usize| (1.0 + gains[..b].iter().sum::<f64>()) / cost(1 + b);
        let first_drop = (0..gains.len())
            .find(|&b| rate(b + 1) <= rate(b))
            .unwrap_or(gains.len());
        assert_eq!(taken, [first_drop]);
        assert!(first_drop > 0 && first_drop < gains.len());
        let explored = choose_nodes(&[&gains], 1, 1.0, cost, true);
        assert_eq!(explored, [first_drop + 1], "one node past the drop");
    }

    #[test]
    fn free_rows_take_every_node_and_costly_rows_none() {
        let gains = [0.5, 0.2, 0.01];
        assert_eq!(choose_nodes(&[&gains], 1, 1.0, |_| 1.0, false), [3]);
        assert_eq!(
            choose_nodes(&[&gains], 1, 1.0, |rows| rows as f64, false),
            [0]
        );
    }

    #[test]
    fn across_a_batch_the_best_nodes_win_in_each_sequences_order() {
        let a = [0.9, 0.2];
        let b = [0.6, 0.5];
        // Rows cost 0.1 each past the two roots: 0.9, 0.6 and 0.5 raise the rate (2 -> 2.64 ->
        // 2.92 -> 3.08), then 0.2 would lower it (3.0).
        let taken = choose_nodes(
            &[&a, &b],
            2,
            2.0,
            |rows| 1.0 + 0.1 * (rows - 2) as f64,
            false,
        );
        assert_eq!(taken, [1, 2]);
        // At 0.3 a row, 0.9 pays (2.23) and 0.6 does not (2.19).
        let taken = choose_nodes(
            &[&a, &b],
            2,
            2.0,
            |rows| 1.0 + 0.3 * (rows - 2) as f64,
            false,
        );
        assert_eq!(taken, [1, 0]);
    }

    #[test]
    fn drafting_pays_when_its_value_beats_the_drafter_and_the_rows() {
        let round =
            |drafting: usize, rows: f64| 1.0 + 0.5 * drafting.min(1) as f64 + 0.1 * (rows - 1.0);
        let good = Some(DraftOption {
            value: 2.0,
            rows: 4.0,
            forced: false,
        });
        let poor = DraftOption {
            value: 0.3,
            rows: 4.0,
            forced: false,
        };
        assert_eq!(choose_drafting(1, &[good], round), [true]);
        assert_eq!(choose_drafting(1, &[Some(poor)], round), [false]);
        let forced = Some(DraftOption {
            forced: true,
            ..poor
        });
        assert_eq!(choose_drafting(1, &[forced], round), [true]);
        assert_eq!(choose_drafting(2, &[None, good], round), [false, true]);
    }
}
