use rayon::prelude::*;

use super::{
    balanced_order, for_each_chunk_mut, for_each_columns_mut, for_each_task, with_threads_awake,
};

#[test]
fn body_runs_once_with_parallel_work_inside_and_outside_a_pool() {
    let sum = |n: u64| (0..n).into_par_iter().sum::<u64>();
    assert_eq!(with_threads_awake(|| sum(1000)), 499_500);
    for threads in [1, 2, 4] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let total = pool.install(|| {
            (0..50)
                .map(|i| with_threads_awake(|| sum(i * 100)))
                .sum::<u64>()
        });
        let expected: u64 = (0..50)
            .map(|i: u64| (i * 100) * (i * 100).saturating_sub(1) / 2)
            .sum();
        assert_eq!(total, expected, "{threads} threads");
    }
}

#[test]
fn concurrent_bodies_in_one_pool_both_finish() {
    // Many owners at once on the two threads of one pool, each with parallel work: a
    // helper of one picked up inside another's body must not wait for the first.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let sum = |n: u64| (0..n).into_par_iter().sum::<u64>();
    for _ in 0..100 {
        let total: u64 = pool.install(|| {
            (0..16u64)
                .into_par_iter()
                .map(|i| with_threads_awake(|| sum(1000 * i)))
                .sum()
        });
        let expected: u64 = (0..16u64)
            .map(|i| 1000 * i * (1000 * i).saturating_sub(1) / 2)
            .sum();
        assert_eq!(total, expected);
    }
}

#[test]
fn a_panicking_body_releases_the_helpers() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let caught =
        pool.install(|| std::panic::catch_unwind(|| with_threads_awake(|| panic!("in the body"))));
    assert!(caught.is_err());
    // The pool still works.
    assert_eq!(pool.install(|| with_threads_awake(|| 7)), 7);
}

/// How many times `for_each_task` ran each of `tasks` tasks (each sleeping a little now and
/// then, so the threads' shares end at different times and the stealing runs).
fn runs(tasks: usize) -> Vec<usize> {
    let counts: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
    for_each_task(tasks, |i| {
        if i % 7 == 3 {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        counts[i].fetch_add(1, Ordering::Relaxed);
    });
    counts.into_iter().map(AtomicUsize::into_inner).collect()
}

use std::sync::atomic::{AtomicUsize, Ordering};

#[test]
fn every_task_runs_once_on_any_number_of_threads() {
    for tasks in [0, 1, 2, 3, 7, 64, 1000] {
        assert_eq!(runs(tasks), vec![1; tasks], "{tasks} tasks outside a pool");
        for threads in [1, 2, 3, 8] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let counts = pool.install(|| with_threads_awake(|| runs(tasks)));
            assert_eq!(counts, vec![1; tasks], "{tasks} tasks, {threads} threads");
            // Many callers at once, each waiting only for its own tasks.
            let all = pool.install(|| {
                (0..6)
                    .into_par_iter()
                    .map(|_| runs(tasks))
                    .collect::<Vec<_>>()
            });
            assert!(all.iter().all(|counts| *counts == vec![1; tasks]));
        }
    }
}

#[test]
fn a_bodys_sections_reach_its_helpers_and_nest() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    pool.install(|| {
        with_threads_awake(|| {
            // Over many sections, tasks run on both threads (through the crew's posts).
            let threads = std::sync::Mutex::new(std::collections::HashSet::new());
            for _ in 0..50 {
                for_each_task(8, |_| {
                    threads.lock().unwrap().insert(std::thread::current().id());
                    std::thread::sleep(std::time::Duration::from_micros(100));
                });
            }
            assert_eq!(threads.lock().unwrap().len(), 2);
            // A section inside a task runs every task once, as does the next one after.
            let counts: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
            for_each_task(8, |i| {
                for_each_task(8, |j| {
                    counts[8 * i + j].fetch_add(1, Ordering::Relaxed);
                })
            });
            assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
            assert_eq!(runs(100), vec![1; 100]);
        })
    });
}

#[test]
fn chunks_cover_every_slice_once_with_their_indices() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let mut a = vec![0usize; 10];
    let mut b: Vec<usize> = Vec::new();
    let mut c = vec![0usize; 4];
    pool.install(|| {
        for_each_chunk_mut(&mut [&mut a, &mut b, &mut c], 4, |s, j, chunk| {
            for (at, value) in chunk.iter_mut().enumerate() {
                *value += 1000 * (s + 1) + 10 * j + at + 1;
            }
        })
    });
    assert_eq!(
        a,
        [1001, 1002, 1003, 1004, 1011, 1012, 1013, 1014, 1021, 1022]
    );
    assert_eq!(c, [3001, 3002, 3003, 3004]);
}

#[test]
fn column_blocks_cover_every_row_of_every_matrix_once() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    for parallel in [false, true] {
        // Three rows: a 3 x 10 matrix (blocks of 4, 4, 2 columns), an empty one, 3 x 4.
        let mut a = vec![0usize; 30];
        let mut b: Vec<usize> = Vec::new();
        let mut c = vec![0usize; 12];
        pool.install(|| {
            let mut matrices = [&mut a[..], &mut b[..], &mut c[..]];
            for_each_columns_mut(&mut matrices, 3, 4, parallel, |s, j, mut columns| {
                for r in 0..3 {
                    for (at, value) in columns.row(r).iter_mut().enumerate() {
                        *value += 1000 * (s + 1) + 100 * r + 10 * j + at + 1;
                    }
                }
            })
        });
        let expected = |s: usize, n: usize| -> Vec<usize> {
            (0..3)
                .flat_map(|r| {
                    (0..n).map(move |col| 1000 * (s + 1) + 100 * r + 10 * (col / 4) + col % 4 + 1)
                })
                .collect()
        };
        assert_eq!(a, expected(0, 10), "parallel {parallel}");
        assert_eq!(c, expected(2, 4), "parallel {parallel}");
    }
}

#[test]
fn a_panicking_task_is_raised_and_the_pool_still_works() {
    for threads in [1, 2, 4] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for bad in [0, 17, 99] {
            let caught = pool.install(|| {
                std::panic::catch_unwind(|| {
                    with_threads_awake(|| {
                        for_each_task(100, |i| assert_ne!(i, bad, "task {bad}"));
                    })
                })
            });
            assert!(caught.is_err(), "{threads} threads, task {bad}");
        }
        assert_eq!(pool.install(|| runs(50)), vec![1; 50]);
    }
}

/// A tree's attention pieces: four of shared context (costly) first, then each row's few
/// keys of its own. In contiguous shares by count, as `for_each_task` starts its threads, the
/// first share drew all four; in the balanced order every share's cost is within the largest
/// task of every other's, each share runs its costliest first, and every task runs once.
#[test]
fn balanced_order_evens_out_the_shares_the_threads_start_on() {
    let mut costs = vec![96 * 256; 4];
    costs.extend((0..32).map(|i| 6 * (1 + i % 16)));
    for threads in [1, 2, 3, 4] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for (inside, order) in [
            (false, pool.install(|| balanced_order(&costs))),
            (
                true,
                pool.install(|| with_threads_awake(|| balanced_order(&costs))),
            ),
        ] {
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..costs.len()).collect::<Vec<_>>(), "{threads}");
            let tasks = costs.len();
            let shares: Vec<&[usize]> = (0..threads)
                .map(|t| &order[t * tasks / threads..(t + 1) * tasks / threads])
                .collect();
            let totals: Vec<usize> = shares
                .iter()
                .map(|share| share.iter().map(|&i| costs[i]).sum())
                .collect();
            let (most, least) = (totals.iter().max().unwrap(), totals.iter().min().unwrap());
            assert!(most - least <= 96 * 256, "{threads} ({inside}): {totals:?}");
            for share in shares {
                assert!(share.windows(2).all(|w| costs[w[0]] >= costs[w[1]]));
            }
        }
    }
    assert!(balanced_order(&[]).is_empty());
}
