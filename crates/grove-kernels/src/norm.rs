//! RMSNorm over host rows, with the residual add before it: `x / sqrt(mean(x^2) + eps) * w`
//! in f32, each row's sum of squares added first to last, as candle's `rms_norm` does (so the
//! bits equal its). The rows go in groups, shared among the threads where there are many.

use std::mem::MaybeUninit;

use crate::threads::for_each_chunk_mut;

/// Rows normed together: a row's sum is one chain of dependent adds, so a group's rows are
/// summed side by side, each in its own order, and the chains overlap.
const GROUP_ROWS: usize = 8;

/// Past this many rows (one group), and from [`PARALLEL_MIN_VALUES`] values, a norm's groups
/// are shared among the threads: a 16-row verify's norms were serial stretches of its forward.
const PARALLEL_ROWS: usize = 8;

/// Below this many values a norm stays on the calling thread (a small model's rows are less
/// work than handing them over); a 16-row verify of Gemma 3 270M has 10 thousand.
const PARALLEL_MIN_VALUES: usize = 1 << 13;

/// The norm of each `weight.len()`-value row of `x`, in place.
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    norm_groups(x, None, None, weight, eps);
}

/// `hidden += branch` (where there is a branch), then the norm of each row of `hidden` as new
/// rows: the bits of adding, copying and norming the copy in place, in one pass over the rows.
/// A residual add and the copy its norm took were serial passes of their own on a forward's
/// thread (a twentieth of those of a 512-token prefill), while the other threads waited.
pub fn add_and_rms_norm(
    hidden: &mut [f32],
    branch: Option<&[f32]>,
    weight: &[f32],
    eps: f32,
) -> Vec<f32> {
    if let Some(branch) = branch {
        assert_eq!(branch.len(), hidden.len(), "branch and rows differ in size");
    }
    let mut out = Vec::with_capacity(hidden.len());
    let values = &mut out.spare_capacity_mut()[..hidden.len()];
    norm_groups(hidden, branch, Some(values), weight, eps);
    // SAFETY: `norm_groups` wrote each of the first `hidden.len()` values (each group's rows
    // whole, and the groups cover the rows).
    #[allow(unsafe_code)]
    unsafe {
        out.set_len(hidden.len())
    };
    out
}

/// A group of rows: the rows, a branch to add into them first, where to write them normed
/// (in place where nowhere).
type Group<'a> = (
    &'a mut [f32],
    Option<&'a [f32]>,
    Option<&'a mut [MaybeUninit<f32>]>,
);

/// The rows of `x` in groups of [`GROUP_ROWS`], on the threads past [`PARALLEL_ROWS`] rows:
/// `branch` added into them, then normed in place or into `out`.
fn norm_groups(
    x: &mut [f32],
    branch: Option<&[f32]>,
    out: Option<&mut [MaybeUninit<f32>]>,
    weight: &[f32],
    eps: f32,
) {
    let dim = weight.len();
    assert!(
        dim > 0 && x.len().is_multiple_of(dim),
        "rows are not [rows, {dim}]"
    );
    let rows = x.len() / dim;
    let group = GROUP_ROWS * dim;
    let mut groups: Vec<Group<'_>> = match out {
        Some(out) => {
            assert_eq!(out.len(), x.len(), "outputs and rows differ in size");
            x.chunks_mut(group)
                .zip(out.chunks_mut(group))
                .map(|(x, out)| (x, None, Some(out)))
                .collect()
        }
        None => x.chunks_mut(group).map(|x| (x, None, None)).collect(),
    };
    if let Some(branch) = branch {
        for (g, branch) in groups.iter_mut().zip(branch.chunks(group)) {
            g.1 = Some(branch);
        }
    }
    let run =
        |(x, branch, out): &mut Group<'_>| norm_group(x, *branch, out.as_deref_mut(), weight, eps);
    if rows > PARALLEL_ROWS && rows * dim >= PARALLEL_MIN_VALUES {
        for_each_chunk_mut(&mut [&mut groups], 1, |_, _, g| run(&mut g[0]));
    } else {
        groups.iter_mut().for_each(run);
    }
}

/// [`norm_groups`]' work on one group (at most [`GROUP_ROWS`] rows of `weight.len()` values).
fn norm_group(
    x: &mut [f32],
    branch: Option<&[f32]>,
    mut out: Option<&mut [MaybeUninit<f32>]>,
    weight: &[f32],
    eps: f32,
) {
    let dim = weight.len();
    if let Some(branch) = branch {
        for (v, b) in x.iter_mut().zip(branch) {
            *v += b;
        }
    }
    let sums = if x.len() == GROUP_ROWS * dim {
        sums_of_squares::<GROUP_ROWS>(x, dim)
    } else {
        let mut sums = [0f32; GROUP_ROWS];
        for (sum, row) in sums.iter_mut().zip(x.chunks_exact(dim)) {
            *sum = row.iter().map(|&v| v * v).sum();
        }
        sums
    };
    for (r, (row, sum2)) in x.chunks_exact_mut(dim).zip(sums).enumerate() {
        let rms = (sum2 / dim as f32 + eps).sqrt();
        match out.as_deref_mut() {
            Some(out) => {
                for ((o, v), w) in out[r * dim..][..dim].iter_mut().zip(&*row).zip(weight) {
                    o.write(v / rms * w);
                }
            }
            None => {
                for (v, w) in row.iter_mut().zip(weight) {
                    *v = *v / rms * w;
                }
            }
        }
    }
}

/// Each of `R` rows' (`dim` values each, one after another in `rows`) sum of squares, in the
/// order `Iterator::sum` adds (first to last), the rows' additions interleaved.
fn sums_of_squares<const R: usize>(rows: &[f32], dim: usize) -> [f32; R] {
    let rows: [&[f32]; R] = std::array::from_fn(|r| &rows[r * dim..][..dim]);
    let mut sums = [0f32; R];
    for i in 0..dim {
        for (sum, row) in sums.iter_mut().zip(rows) {
            *sum += row[i] * row[i];
        }
    }
    sums
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each row normed alone, one value after another (the reference the groups and threads
    /// must equal bit for bit).
    fn reference(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
        let dim = weight.len();
        x.chunks_exact(dim)
            .flat_map(|row| {
                let sum2: f32 = row.iter().map(|&v| v * v).sum();
                let rms = (sum2 / dim as f32 + eps).sqrt();
                row.iter().zip(weight).map(move |(v, w)| v / rms * w)
            })
            .collect()
    }

    /// In place and into new rows, with and without a branch added first, in groups, a
    /// group's remainder and on the threads: every row's bits are its reference's, and the
    /// rows hold their sums with the branch.
    #[test]
    fn norms_of_any_rows_equal_each_row_alone() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        // 96 values a row stay on one thread; 256 (from 32 rows) go to the threads.
        for (dim, rows) in [96, 256]
            .into_iter()
            .flat_map(|dim| [1, 7, 8, 9, 16, 19, 33, 40, 67].map(|rows| (dim, rows)))
        {
            let weight: Vec<f32> = (0..dim).map(|i| 0.5 + (i as f32 * 0.37).sin()).collect();
            let x: Vec<f32> = (0..rows * dim)
                .map(|i| (i as f32 * 0.731).sin() * (1.0 + (i % 13) as f32))
                .collect();
            let branch: Vec<f32> = (0..rows * dim).map(|i| (i as f32 * 0.29).cos()).collect();
            let sum: Vec<f32> = x.iter().zip(&branch).map(|(a, b)| a + b).collect();
            let mut in_place = x.clone();
            pool.install(|| rms_norm(&mut in_place, &weight, 1e-6));
            assert_eq!(
                bits(&in_place),
                bits(&reference(&x, &weight, 1e-6)),
                "{rows} rows of {dim}"
            );
            let mut hidden = x.clone();
            let normed = pool.install(|| add_and_rms_norm(&mut hidden, None, &weight, 1e-6));
            assert_eq!(bits(&normed), bits(&in_place), "{rows} rows of {dim}");
            assert_eq!(hidden, x, "{rows} rows of {dim}: no branch, rows unchanged");
            let mut hidden = x.clone();
            let normed = add_and_rms_norm(&mut hidden, Some(&branch), &weight, 1e-6);
            assert_eq!(bits(&hidden), bits(&sum), "{rows} rows of {dim}");
            assert_eq!(
                bits(&normed),
                bits(&reference(&sum, &weight, 1e-6)),
                "{rows} rows of {dim}"
            );
        }
    }
}
