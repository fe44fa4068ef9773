//! Keeping the compute threads awake through a forward pass.
//!
//! A decoding step of a small model is a few hundred parallel sections of 20-200 us each
//! (every matrix product), separated by short serial stretches (norms, RoPE, attention of one
//! row). Between sections rayon's idle threads go to sleep, and waking one costs 20-40 us
//! here, measured from the start of a product to the first task another thread picked up: on
//! Gemma 3 270M, about as long as the product itself. llama.cpp keeps its threads polling
//! for the same reason.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    /// How many `with_threads_awake` bodies are running on this thread (nested calls count).
    static BODIES: Cell<usize> = const { Cell::new(0) };
}

/// Runs `body` on the current thread while the current rayon pool's other threads poll for
/// its parallel work (through `rayon::yield_now`) instead of sleeping, until `body` returns.
/// Outside a pool, or in a pool of one, `body` just runs.
pub fn with_threads_awake<R>(body: impl FnOnce() -> R) -> R {
    let helpers = rayon::current_num_threads().saturating_sub(1);
    if rayon::current_thread_index().is_none() || helpers == 0 {
        return body();
    }
    /// Ends the polling however `body` leaves (a panic included), so the scope can finish,
    /// and leaves this thread's body count as it found it.
    struct Done<'a>(&'a AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
            BODIES.with(|bodies| bodies.set(bodies.get() - 1));
        }
    }
    let done = AtomicBool::new(false);
    rayon::in_place_scope(|scope| {
        for _ in 0..helpers {
            scope.spawn(|_| {
                // A thread inside a body (this one's owner waiting on a job, or another
                // owner's) may pick up a helper while it waits; polling there would keep that
                // body from finishing, and two owners could wait on each other forever.
                if BODIES.with(Cell::get) > 0 {
                    return;
                }
                while !done.load(Ordering::Acquire) {
                    if rayon::yield_now() != Some(rayon::Yield::Executed) {
                        std::hint::spin_loop();
                    }
                }
            });
        }
        BODIES.with(|bodies| bodies.set(bodies.get() + 1));
        let _done = Done(&done);
        body()
    })
}

#[cfg(test)]
mod tests {
    use rayon::prelude::*;

    use super::with_threads_awake;

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
        let caught = pool
            .install(|| std::panic::catch_unwind(|| with_threads_awake(|| panic!("in the body"))));
        assert!(caught.is_err());
        // The pool still works.
        assert_eq!(pool.install(|| with_threads_awake(|| 7)), 7);
    }
}
