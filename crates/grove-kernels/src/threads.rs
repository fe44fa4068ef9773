//! Keeping the compute threads awake through a forward pass, and handing them its parallel
//! sections' tasks.
//!
//! A decoding step of a small model is a few hundred parallel sections of 20-200 us each
//! (every matrix product), separated by short serial stretches (norms, RoPE, attention of one
//! row). Between sections rayon's idle threads go to sleep, and waking one costs 20-40 us
//! here, measured from the start of a product to the first task another thread picked up: on
//! Gemma 3 270M, about as long as the product itself. llama.cpp keeps its threads polling
//! for the same reason.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::mem::MaybeUninit;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

thread_local! {
    /// How many `with_threads_awake` bodies are running on this thread (nested calls count).
    static BODIES: Cell<usize> = const { Cell::new(0) };
    /// The crew of the innermost body running on this thread, while none of its jobs runs.
    static CREW: Cell<*const Crew> = const { Cell::new(std::ptr::null()) };
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
    /// and leaves this thread's body count and crew as it found them.
    struct Done<'a>(&'a AtomicBool, *const Crew);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
            BODIES.with(|bodies| bodies.set(bodies.get() - 1));
            CREW.with(|crew| crew.set(self.1));
        }
    }
    let done = AtomicBool::new(false);
    let crew = Crew::new(helpers);
    rayon::in_place_scope(|scope| {
        for _ in 0..helpers {
            scope.spawn(|_| {
                // A thread inside a body (this one's owner waiting on a job, or another
                // owner's) may pick up a helper while it waits; polling there would keep that
                // body from finishing, and two owners could wait on each other forever.
                if BODIES.with(Cell::get) > 0 {
                    return;
                }
                let mut seen = 0;
                while !done.load(Ordering::Acquire) {
                    // The crew's jobs first, checked between rayon's (a check is one load).
                    for _ in 0..CREW_CHECKS {
                        if crew.serve(&mut seen) {
                            break;
                        }
                        std::hint::spin_loop();
                    }
                    if rayon::yield_now() != Some(rayon::Yield::Executed) {
                        std::hint::spin_loop();
                    }
                }
            });
        }
        BODIES.with(|bodies| bodies.set(bodies.get() + 1));
        let _done = Done(&done, CREW.with(|c| c.replace(&crew)));
        body()
    })
}

/// How many times a polling helper checks its crew for a job between two looks at rayon's
/// queues (which take hundreds of nanoseconds each).
const CREW_CHECKS: usize = 64;

/// The polling helpers of one `with_threads_awake` body, and the one place the body's thread
/// posts its parallel sections ([`for_each_task`]) for them. Through rayon (a job spawned into
/// a scope, stolen from the owner's queue by a helper between its `yield_now`s) a helper
/// started its share 2.5-2.8 us after the section did, on each of a Qwen2.5-0.5B decode
/// step's 113 sections; here it starts as soon as it sees the post.
struct Crew {
    /// The posted job's generation (high 32 bits) and how many of its helper places are
    /// still open (low 32 bits): a helper claims a place by taking one.
    state: AtomicU64,
    /// The posted job; a helper may read it only after claiming a place.
    job: AtomicPtr<Job<'static>>,
    /// Helpers of the posted job done with it (they no longer touch it).
    released: AtomicUsize,
    /// Threads polling here (besides the body's own).
    helpers: usize,
}

/// One parallel section posted to a [`Crew`]: `run(me)` is participant `me`'s part.
struct Job<'a> {
    run: &'a (dyn Fn(usize) + Sync),
    /// The next participant number to hand out (the owner is 0).
    next: AtomicUsize,
    /// A helper's panic, raised again on the owner's thread.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Crew {
    fn new(helpers: usize) -> Self {
        Self {
            state: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            released: AtomicUsize::new(0),
            helpers,
        }
    }

    fn unpack(state: u64) -> (u64, u64) {
        (state >> 32, state & u64::from(u32::MAX))
    }

    /// A helper's check: runs its part of a posted job it has not seen, if a place is open.
    /// Returns whether it found one to try for.
    fn serve(&self, seen: &mut u64) -> bool {
        let state = self.state.load(Ordering::Acquire);
        let (generation, open) = Self::unpack(state);
        if generation == *seen || open == 0 {
            return false;
        }
        if self
            .state
            .compare_exchange(state, state - 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return true;
        }
        *seen = generation;
        // SAFETY: a claimed place keeps the job alive: its owner closes the post and then
        // waits for every claimed place's release (below) before the job goes away.
        #[allow(unsafe_code)]
        let job = unsafe { &*self.job.load(Ordering::Acquire) };
        let me = job.next.fetch_add(1, Ordering::Relaxed);
        if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| (job.run)(me))) {
            *job.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(panic);
        }
        self.released.fetch_add(1, Ordering::Release);
        true
    }

    /// Posts `run` for `places` helpers, runs `run(0)` here, then `wait()`s (for the
    /// section's tasks), closes the post and waits for the helpers that joined to leave it.
    /// A helper's panic is raised here.
    fn run(&self, places: usize, run: &(dyn Fn(usize) + Sync), wait: impl FnOnce()) {
        let job = Job {
            run,
            next: AtomicUsize::new(1),
            panic: Mutex::new(None),
        };
        /// Closes the post and waits out its helpers however the owner's part ends.
        struct Closing<'a>(&'a Crew, usize);
        impl Drop for Closing<'_> {
            fn drop(&mut self) {
                let crew = self.0;
                let mut state = crew.state.load(Ordering::Acquire);
                let left = loop {
                    let (generation, open) = Crew::unpack(state);
                    match crew.state.compare_exchange_weak(
                        state,
                        generation << 32,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => break open as usize,
                        Err(actual) => state = actual,
                    }
                };
                let claimed = self.1 - left;
                while crew.released.load(Ordering::Acquire) < claimed {
                    std::hint::spin_loop();
                }
            }
        }
        self.released.store(0, Ordering::Relaxed);
        // The lifetime is erased for the post: `Closing` keeps the job alive while posted.
        let posted: *const Job<'_> = &job;
        self.job.store(posted.cast_mut().cast(), Ordering::Release);
        // Generations 1..=u32::MAX, round and round (a helper's first `seen` is 0).
        let generation =
            Self::unpack(self.state.load(Ordering::Relaxed)).0 % u64::from(u32::MAX) + 1;
        self.state
            .store((generation << 32) | places as u64, Ordering::Release);
        {
            let _closing = Closing(self, places);
            run(0);
            wait();
        }
        let panic = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(panic) = panic {
            std::panic::resume_unwind(panic);
        }
    }
}

/// How many threads [`for_each_task`] called here would share its tasks among (before
/// limiting them to the task count).
fn team() -> usize {
    let crew = CREW.with(Cell::get);
    // SAFETY: a crew outlives its body, and this thread is inside that body while the
    // thread-local points at it.
    #[allow(unsafe_code)]
    let crew = unsafe { crew.as_ref() };
    1 + crew.map_or_else(|| rayon::current_num_threads() - 1, |crew| crew.helpers)
}

/// An order for tasks of the given `costs` (in any unit) to run in through [`for_each_task`]:
/// position `p` runs task `order[p]`. Each thread starts on its own contiguous share of the
/// positions, so a share that drew the few costly tasks (a tree's pieces of shared context
/// beside each row's few keys of its own) kept the others waiting at the end; here the tasks,
/// costliest first, are dealt to the shares back and forth, each share's in falling cost, so
/// the shares start about even and what the threads take from each other's backs is small.
pub fn balanced_order(costs: &[usize]) -> Vec<usize> {
    let tasks = costs.len();
    let threads = team().min(tasks).max(1);
    let mut by_cost: Vec<usize> = (0..tasks).collect();
    by_cost.sort_by_key(|&i| std::cmp::Reverse(costs[i]));
    // The share sizes `for_each_task` cuts.
    let mut room: Vec<usize> = (0..threads)
        .map(|t| (t + 1) * tasks / threads - t * tasks / threads)
        .collect();
    let mut shares: Vec<Vec<usize>> = room.iter().map(|&n| Vec::with_capacity(n)).collect();
    let mut snake = (0..threads).chain((0..threads).rev()).cycle();
    for task in by_cost {
        // The shares' sizes add up to the tasks: one with room is within a round.
        let t = snake.find(|&t| room[t] > 0).expect("room for every task");
        room[t] -= 1;
        shares[t].push(task);
    }
    shares.concat()
}

/// Runs `task(i)` once for every `i` in `0..tasks` on the current rayon pool's threads (the
/// global pool's outside one), and returns when all have run; a panic in a task is raised
/// here once the others stop.
///
/// Each thread starts with its own contiguous share of the tasks and takes them in order, so
/// where the tasks are consecutive weight rows it streams through one stretch of memory (its
/// prefetches run on across task boundaries); a thread done with its share then takes the
/// last task left in the share with the most left, one at a time, so the threads end within
/// about one task of each other. The calling thread waits for the last tasks by spinning,
/// not in rayon's join, which puts a waiting thread to sleep within tens of microseconds and
/// takes as long again to wake it. Inside a [`with_threads_awake`] body, on its thread, the
/// section is posted to the body's polling helpers directly (its `Crew`); elsewhere (and for a
/// section inside a task) it goes through rayon. On Qwen2.5-0.5B's q/k/v products (36 tasks of about 2 us),
/// rayon's splitting left the threads idle between tasks and ending far apart whenever one
/// was slowed: a 300-token decode 44.9 -> 51 tok/s (medians of 8, alternating).
pub fn for_each_task(tasks: usize, task: impl Fn(usize) + Sync) {
    /// Gives this thread its crew back however the section ends (while a job of the crew
    /// runs, a section started inside one of its tasks goes through rayon).
    struct Lent(*const Crew);
    impl Drop for Lent {
        fn drop(&mut self) {
            CREW.with(|crew| crew.set(self.0));
        }
    }
    let lent = Lent(CREW.with(|crew| crew.replace(std::ptr::null())));
    // SAFETY: a crew outlives its body, and this thread is inside that body while the
    // thread-local points at it (`with_threads_awake` restores the previous one on leaving).
    #[allow(unsafe_code)]
    let crew = unsafe { lent.0.as_ref() };
    let helpers = crew.map_or_else(|| rayon::current_num_threads() - 1, |crew| crew.helpers);
    let threads = (helpers + 1).min(tasks);
    if threads <= 1 {
        (0..tasks).for_each(task);
        return;
    }
    let shares: Vec<Share> = (0..threads)
        .map(|t| Share::new(t * tasks / threads, (t + 1) * tasks / threads))
        .collect();
    let panicked = AtomicBool::new(false);
    let run = |me: usize| {
        /// Tells the waiting thread that a task panicked, so that it stops waiting for it.
        struct Unwinding<'a>(&'a AtomicBool);
        impl Drop for Unwinding<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.store(true, Ordering::Release);
                }
            }
        }
        let _unwinding = Unwinding(&panicked);
        let mut ran = 0;
        while let Some(i) = shares[me].take_front() {
            task(i);
            ran += 1;
        }
        loop {
            let victim = shares
                .iter()
                .max_by_key(|share| share.left())
                .expect("at least one share");
            if let Some(i) = victim.take_back() {
                task(i);
                ran += 1;
            } else if victim.left() == 0 {
                break;
            }
        }
        shares[me].finished.fetch_add(ran, Ordering::Release);
    };
    // Every task is taken once the owner's part returns: wait for those still running
    // elsewhere.
    let wait = || {
        let finished = || {
            shares
                .iter()
                .map(|share| share.finished.load(Ordering::Acquire))
                .sum::<usize>()
        };
        while finished() < tasks && !panicked.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
    };
    match crew {
        Some(crew) => crew.run(threads - 1, &run, wait),
        None => rayon::in_place_scope(|scope| {
            for me in 1..threads {
                let run = &run;
                scope.spawn(move |_| run(me));
            }
            run(0);
            wait();
        }),
    }
}

/// Runs `body(s, j, chunk)` for every `chunk_len`-long chunk `j` of every slice `slices[s]`
/// (the last chunk of each may be shorter) through [`for_each_task`]: the chunks of all the
/// slices are one list of tasks, in order.
pub fn for_each_chunk_mut<T: Send>(
    slices: &mut [&mut [T]],
    chunk_len: usize,
    body: impl Fn(usize, usize, &mut [T]) + Sync,
) {
    assert!(chunk_len > 0, "chunks of no elements");
    /// A slice's start and length, shared by the threads that each borrow chunks of it.
    struct Slice<T>(*mut T, usize);
    // SAFETY: only disjoint chunks of the slice are handed out (below), of `T: Send` values.
    #[allow(unsafe_code)]
    unsafe impl<T: Send> Sync for Slice<T> {}
    let bases: Vec<Slice<T>> = slices
        .iter_mut()
        .map(|slice| Slice(slice.as_mut_ptr(), slice.len()))
        .collect();
    // Where each slice's chunks start in the one list (a prefill's attention has a slice per
    // row and KV head: a search, not a walk, finds a task's).
    let firsts: Vec<usize> = slices
        .iter()
        .scan(0, |next, slice| {
            let first = *next;
            *next += slice.len().div_ceil(chunk_len);
            Some(first)
        })
        .collect();
    let tasks = slices.last().map_or(0, |slice| {
        firsts[firsts.len() - 1] + slice.len().div_ceil(chunk_len)
    });
    for_each_task(tasks, |task| {
        // The last slice starting at or before `task` (empty slices start where the next does).
        let s = firsts.partition_point(|&first| first <= task) - 1;
        let j = task - firsts[s];
        let Slice(start, len) = bases[s];
        let at = j * chunk_len;
        // SAFETY: `for_each_task` runs each task once, so chunk `j` of slice `s` (inside it: `s`
        // is the last slice whose chunks start at or before the task, so `at < len`) is
        // borrowed once, while `slices` stays borrowed mutably.
        #[allow(unsafe_code)]
        let chunk =
            unsafe { std::slice::from_raw_parts_mut(start.add(at), chunk_len.min(len - at)) };
        body(s, j, chunk);
    });
}

/// Columns `first..first + width` of every row of a `[rows, n]` matrix: one task's part of
/// an output that tasks share out by columns (a product's weight rows), handed out a row at a
/// time, so no two tasks' slices overlap.
pub struct Columns<'a, T> {
    base: *mut T,
    n: usize,
    first: usize,
    width: usize,
    rows: usize,
    matrix: std::marker::PhantomData<&'a mut [T]>,
}

impl<T> Columns<'_, T> {
    pub fn width(&self) -> usize {
        self.width
    }

    /// Row `r`'s columns.
    pub fn row(&mut self, r: usize) -> &mut [T] {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        // SAFETY: `for_each_columns_mut` made `base` a `[rows, n]` matrix borrowed mutably
        // for the task's life, and gave each task its own columns: row `r`'s are inside the
        // matrix and no other task's; `&mut self` lends one row at a time.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.base.add(r * self.n + self.first), self.width)
        }
    }
}

impl Columns<'_, MaybeUninit<f32>> {
    /// The columns filled by `compute`, which writes every value of the task's `[rows,
    /// width]` products into the slice it is given (what is there before is unspecified):
    /// one row's columns in place, more rows through a thread-local block (in cache) whose
    /// rows then go to their columns.
    pub fn fill(&mut self, compute: impl FnOnce(&mut [f32])) {
        if self.rows == 1 {
            compute(zeroed(self.row(0)));
            return;
        }
        thread_local! {
            static BLOCK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
        }
        BLOCK.with_borrow_mut(|block| {
            let block = scratch(block, self.width * self.rows);
            compute(block);
            for (r, products) in block.chunks_exact(self.width).enumerate() {
                for (out, &value) in self.row(r).iter_mut().zip(products) {
                    out.write(value);
                }
            }
        });
    }

    /// The columns filled in place by `compute`, which writes every value of the rows it is
    /// lent (the quantized products' kernels store each output once): no block in between,
    /// whose copy to the columns was a second pass over every output of a many-row product.
    pub fn fill_rows(&mut self, compute: impl FnOnce(OutRows<'_>)) {
        compute(OutRows {
            // SAFETY: `for_each_columns_mut` made `base` a `[rows, n]` matrix and gave this
            // task columns `first..first + width` of it, inside every row.
            #[allow(unsafe_code)]
            base: unsafe { self.base.add(self.first) }.cast::<f32>(),
            stride: self.n,
            width: self.width,
            rows: self.rows,
            lent: std::marker::PhantomData,
        });
    }
}

/// `rows` rows of `width` floats, row `r` at `r * stride` from the first: a task's columns
/// of an output whose other columns other tasks write (so no one slice may hold them), or a
/// block of its own. Lent to one writer while it lives; rows come out one at a time.
pub struct OutRows<'a> {
    base: *mut f32,
    stride: usize,
    width: usize,
    rows: usize,
    lent: std::marker::PhantomData<&'a mut [f32]>,
}

impl<'a> OutRows<'a> {
    /// `block` as `[rows, block.len() / rows]`.
    pub fn block(block: &'a mut [f32], rows: usize) -> Self {
        assert!(
            rows > 0 && block.len().is_multiple_of(rows),
            "a block of {} values is not {rows} rows",
            block.len()
        );
        Self {
            base: block.as_mut_ptr(),
            stride: block.len() / rows,
            width: block.len() / rows,
            rows,
            lent: std::marker::PhantomData,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn width(&self) -> usize {
        self.width
    }

    /// How far apart the rows start.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// Row 0's first value: row `r`'s `width` values start `r * stride` after it, and
    /// nothing else of the allocation between them is the writer's.
    pub fn as_mut_ptr(&mut self) -> *mut f32 {
        self.base
    }

    /// Row `r`'s values, to be written (they may not be yet: [`Columns::fill_rows`] lends
    /// fresh memory).
    pub fn row(&mut self, r: usize) -> &mut [MaybeUninit<f32>] {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        // SAFETY: row `r` is inside what was lent (`fill_rows`, `block`); `&mut self` lends
        // one row at a time; `MaybeUninit<f32>` has f32's layout, and writing one keeps what
        // was initialized so.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(
                self.base.add(r * self.stride).cast::<MaybeUninit<f32>>(),
                self.width,
            )
        }
    }

    /// Rows `from..from + rows`, lent on while the result lives.
    pub fn part(&mut self, from: usize, rows: usize) -> OutRows<'_> {
        assert!(
            rows > 0 && from + rows <= self.rows,
            "rows {from}..{} of {}",
            from + rows,
            self.rows
        );
        OutRows {
            // SAFETY: row `from` is inside what was lent.
            #[allow(unsafe_code)]
            base: unsafe { self.base.add(from * self.stride) },
            stride: self.stride,
            width: self.width,
            rows,
            lent: std::marker::PhantomData,
        }
    }
}

/// The first `len` values of a thread's scratch buffer, grown (zeroed) where it is shorter
/// and otherwise left as the last user left them: every user writes what it reads first, or
/// reads past that only into lanes or outputs it drops (clearing a product task's block each
/// time was a `memset` call per task, hundreds per product of a many-row verify).
pub(crate) fn scratch(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
    &mut buffer[..len]
}

/// `values` set to zero, as the floats they now are.
pub(crate) fn zeroed(values: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    for value in values.iter_mut() {
        value.write(0.0);
    }
    // SAFETY: every value was just initialized, and `MaybeUninit<f32>` has the layout of f32.
    #[allow(unsafe_code)]
    unsafe {
        &mut *(std::ptr::from_mut(values) as *mut [f32])
    }
}

/// Runs `body(s, j, columns)` for every `task_columns`-wide block of columns `j` of every
/// `[rows, n]` matrix `matrices[s]` (`n = len / rows`; the last block of each may be
/// narrower), as one list of tasks in order: on the current threads ([`for_each_task`]) where
/// `parallel`, else on this one. Each task writes its own columns straight into the output,
/// where writing a `[rows, width]` block first made a second pass over every output to put
/// the blocks in order (a 16-row verify of Qwen2.5-Coder-1.5B copied 35 MB of them).
pub fn for_each_columns_mut<T: Send>(
    matrices: &mut [&mut [T]],
    rows: usize,
    task_columns: usize,
    parallel: bool,
    body: impl Fn(usize, usize, Columns<'_, T>) + Sync,
) {
    assert!(
        rows > 0 && task_columns > 0,
        "no rows or no columns per task"
    );
    /// A matrix's start and width, shared by the tasks that each write its own columns.
    struct Matrix<T>(*mut T, usize);
    // SAFETY: the tasks' columns are disjoint (`Columns`), of `T: Send` values.
    #[allow(unsafe_code)]
    unsafe impl<T: Send> Sync for Matrix<T> {}
    let bases: Vec<Matrix<T>> = matrices
        .iter_mut()
        .map(|matrix| {
            assert!(
                matrix.len().is_multiple_of(rows),
                "a matrix is not [rows, n]"
            );
            Matrix(matrix.as_mut_ptr(), matrix.len() / rows)
        })
        .collect();
    let firsts: Vec<usize> = bases
        .iter()
        .scan(0, |next, &Matrix(_, n)| {
            let first = *next;
            *next += n.div_ceil(task_columns);
            Some(first)
        })
        .collect();
    let tasks = bases
        .iter()
        .map(|&Matrix(_, n)| n.div_ceil(task_columns))
        .sum();
    let run = |task: usize| {
        let s = firsts.partition_point(|&first| first <= task) - 1;
        let j = task - firsts[s];
        let Matrix(base, n) = bases[s];
        let first = j * task_columns;
        let columns = Columns {
            base,
            n,
            first,
            width: task_columns.min(n - first),
            rows,
            matrix: std::marker::PhantomData,
        };
        body(s, j, columns);
    };
    if parallel {
        for_each_task(tasks, run);
    } else {
        (0..tasks).for_each(run);
    }
}

/// One thread's share of [`for_each_task`]'s tasks: the untaken `front..back` in one word,
/// its owner taking from the front and other threads from the back, on cache lines of its
/// own (the threads' claims do not contend until one runs out).
#[repr(align(128))]
struct Share {
    range: AtomicU64,
    /// Tasks run by the thread that ran this share's loop (added once, when it ends).
    finished: AtomicUsize,
}

impl Share {
    fn new(front: usize, back: usize) -> Self {
        Self {
            range: AtomicU64::new(Self::pack(front, back)),
            finished: AtomicUsize::new(0),
        }
    }

    fn pack(front: usize, back: usize) -> u64 {
        let back = u32::try_from(back).expect("fewer than 2^32 tasks");
        ((front as u64) << 32) | u64::from(back)
    }

    fn unpack(range: u64) -> (usize, usize) {
        (
            (range >> 32) as usize,
            (range & u64::from(u32::MAX)) as usize,
        )
    }

    fn left(&self) -> usize {
        let (front, back) = Self::unpack(self.range.load(Ordering::Relaxed));
        back.saturating_sub(front)
    }

    fn take_front(&self) -> Option<usize> {
        self.take(|front, back| (front, Self::pack(front + 1, back)))
    }

    fn take_back(&self) -> Option<usize> {
        self.take(|front, back| (back - 1, Self::pack(front, back - 1)))
    }

    /// One task, if any is left: `take(front, back)` gives it and the range without it.
    fn take(&self, take: impl Fn(usize, usize) -> (usize, u64)) -> Option<usize> {
        let mut current = self.range.load(Ordering::Relaxed);
        loop {
            let (front, back) = Self::unpack(current);
            if front >= back {
                return None;
            }
            let (task, next) = take(front, back);
            match self.range.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(task),
                Err(actual) => current = actual,
            }
        }
    }
}

#[cfg(test)]
mod tests;
