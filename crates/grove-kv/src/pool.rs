use std::sync::{Arc, Mutex, MutexGuard};

use crate::{KvError, KvStore, PageId};

/// Free list and reference counts shared by every [`PageTable`] of one pool.
#[derive(Debug)]
struct PoolState {
    free: Vec<PageId>,
    /// Holders of each page: page tables and the prefix cache.
    refs: Vec<u32>,
}

impl PoolState {
    fn release(&mut self, page: PageId) {
        let refs = &mut self.refs[page as usize];
        debug_assert!(*refs > 0, "page {page} released more often than held");
        *refs -= 1;
        if *refs == 0 {
            self.free.push(page);
        }
    }
}

/// A handle to a pool of `total_pages` pages of `page_size` slots. Cloning shares the pool.
///
/// Invariant: a page is on the free list exactly when nothing holds it; otherwise its count
/// is the number of page tables (at most once each) and prefix caches holding it. A table
/// writes only past its shared prefix, so a page held more than once is never written.
#[derive(Debug, Clone)]
pub struct PagePool {
    state: Arc<Mutex<PoolState>>,
    page_size: usize,
    total_pages: usize,
}

impl PagePool {
    pub fn new(total_pages: usize, page_size: usize) -> Result<Self, KvError> {
        if page_size == 0 {
            return Err(KvError::ZeroPageSize);
        }
        // Reversed so that pages are handed out in increasing order, which keeps traces readable.
        let free = (0..total_pages as PageId).rev().collect();
        Ok(Self {
            state: Arc::new(Mutex::new(PoolState {
                free,
                refs: vec![0; total_pages],
            })),
            page_size,
            total_pages,
        })
    }

    /// The number of pages needed to hold `num_tokens` tokens.
    pub fn pages_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.page_size)
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    pub fn total_pages(&self) -> usize {
        self.total_pages
    }

    /// Number of physical slots, the first dimension of the matching [`crate::KvStore`].
    pub fn num_slots(&self) -> usize {
        self.total_pages * self.page_size
    }

    pub fn free_pages(&self) -> usize {
        self.lock().free.len()
    }

    /// Pages something holds (a page table or a prefix cache).
    pub fn held_pages(&self) -> usize {
        self.total_pages - self.free_pages()
    }

    /// How many holders `page` has (0: it is free).
    pub fn holders(&self, page: PageId) -> u32 {
        self.lock().refs[page as usize]
    }

    /// Adds a holder to each of `pages`, which must be held already (a prefix cache taking the
    /// pages of a table, or a table sharing the cache's).
    pub fn retain(&self, pages: &[PageId]) {
        let mut state = self.lock();
        for &page in pages {
            debug_assert!(state.refs[page as usize] > 0, "retain of free page {page}");
            state.refs[page as usize] += 1;
        }
    }

    /// Drops a holder of each of `pages`; a page nothing holds any more returns to the free list.
    pub fn release(&self, pages: &[PageId]) {
        let mut state = self.lock();
        for &page in pages.iter().rev() {
            state.release(page);
        }
    }

    /// An empty page table that allocates from this pool.
    pub fn new_table(&self) -> PageTable {
        PageTable {
            pool: self.clone(),
            pages: Vec::new(),
            len: 0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // A panic while holding the lock cannot leave the free list half-updated (every
        // critical section is a single push/pop loop), so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The pages of one sequence and how many of its logical slots hold committed tokens.
///
/// Invariant: `pages.len() * page_size >= len`; logical index `i < len` maps to slot
/// [`PageTable::slot`]`(i)`. Dropping the table returns every page to the pool.
#[derive(Debug)]
pub struct PageTable {
    pool: PagePool,
    pages: Vec<PageId>,
    len: usize,
}

impl PageTable {
    /// Number of committed tokens.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of tokens the owned pages can hold.
    pub fn capacity(&self) -> usize {
        self.pages.len() * self.pool.page_size
    }

    pub fn pages(&self) -> &[PageId] {
        &self.pages
    }

    pub fn page_size(&self) -> usize {
        self.pool.page_size
    }

    /// The physical slot of logical index `index` (which may lie past `len`, up to capacity).
    pub fn slot(&self, index: usize) -> usize {
        let page_size = self.pool.page_size;
        self.pages[index / page_size] as usize * page_size + index % page_size
    }

    /// Makes room for `additional` tokens after the committed ones. All or nothing: on error no
    /// page was taken.
    pub fn reserve(&mut self, additional: usize) -> Result<(), KvError> {
        let needed_pages = self.pool.pages_for(self.len + additional);
        if needed_pages <= self.pages.len() {
            return Ok(());
        }
        let missing = needed_pages - self.pages.len();
        let mut state = self.pool.lock();
        if state.free.len() < missing {
            return Err(KvError::OutOfPages {
                needed: missing,
                free: state.free.len(),
                total: self.pool.total_pages,
                page_size: self.pool.page_size,
            });
        }
        let start = state.free.len() - missing;
        let taken: Vec<PageId> = state.free.drain(start..).rev().collect();
        for &page in &taken {
            state.refs[page as usize] = 1;
        }
        self.pages.extend(taken);
        Ok(())
    }

    /// Pages [`PageTable::reserve`]`(additional)` would take from the pool.
    pub fn pages_missing(&self, additional: usize) -> usize {
        self.pool
            .pages_for(self.len + additional)
            .saturating_sub(self.pages.len())
    }

    /// Starts an empty table on `pages`, full pages already holding the first
    /// `pages.len() * page_size` tokens (a prefix-cache hit). The table holds them like its
    /// own and writes only after them.
    pub fn share_prefix(&mut self, pages: &[PageId]) {
        assert!(
            self.pages.is_empty(),
            "a shared prefix starts an empty table"
        );
        self.pool.retain(pages);
        self.pages.extend_from_slice(pages);
        self.len = pages.len() * self.pool.page_size;
    }

    /// The pool the table allocates from.
    pub fn pool(&self) -> &PagePool {
        &self.pool
    }

    /// Marks `count` more reserved slots as committed.
    pub fn append(&mut self, count: usize) {
        debug_assert!(
            self.len + count <= self.capacity(),
            "append past reservation"
        );
        self.len += count;
    }

    /// Keeps the first `new_len` tokens and returns every page that no longer holds one.
    pub fn truncate(&mut self, new_len: usize) {
        debug_assert!(new_len <= self.capacity());
        self.len = new_len;
        let keep = self.pool.pages_for(new_len);
        if keep < self.pages.len() {
            let mut state = self.pool.lock();
            for page in self.pages.drain(keep..).rev() {
                state.release(page);
            }
        }
    }
}

impl PageTable {
    /// Commits the accepted path of a verified tree: the rows written at logical indices
    /// `base + path[m]` become `base + m` for every `m`, the length becomes
    /// `base + path.len()`, and every page holding only rejected rows returns to the pool.
    ///
    /// `path` must be strictly increasing (a root-to-leaf path in pop order, so
    /// `path[m] >= m`). With one-token pages nothing moves: the page list is reordered. With
    /// larger pages the K/V rows are copied in increasing `m`, which never overwrites a row
    /// still to be read. A chain prefix (`path[m] == m`) moves nothing either way.
    pub fn commit_path(&mut self, store: &mut KvStore, base: usize, path: &[usize]) {
        debug_assert_eq!(self.len, base, "commit_path expects the rows uncommitted");
        debug_assert!(path.windows(2).all(|w| w[0] < w[1]), "path must increase");
        debug_assert!(path
            .last()
            .is_none_or(|&last| base + last < self.capacity()));
        let in_place = path.iter().enumerate().all(|(m, &node)| m == node);
        if !in_place {
            if self.pool.page_size == 1 {
                let tail: Vec<PageId> = self.pages.drain(base..).collect();
                let mut kept = vec![false; tail.len()];
                for &node in path {
                    self.pages.push(tail[node]);
                    kept[node] = true;
                }
                self.pages.extend(
                    tail.iter()
                        .zip(&kept)
                        .filter(|(_, &k)| !k)
                        .map(|(&page, _)| page),
                );
            } else {
                for (m, &node) in path.iter().enumerate().filter(|(m, node)| m != *node) {
                    store.copy_slot(self.slot(base + node), self.slot(base + m));
                }
            }
        }
        self.truncate(base + path.len());
    }
}

impl Drop for PageTable {
    fn drop(&mut self) {
        self.truncate(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn slots_follow_the_page_table() {
        let pool = PagePool::new(8, 4).unwrap();
        let mut other = pool.new_table();
        other.reserve(3).unwrap();
        let mut table = pool.new_table();
        table.reserve(6).unwrap();
        assert_eq!(table.pages(), &[1, 2]);
        assert_eq!(table.slot(0), 4);
        assert_eq!(table.slot(5), 9);
    }

    #[test]
    fn exhausted_pool_takes_nothing_and_names_the_flag() {
        let pool = PagePool::new(2, 4).unwrap();
        let mut table = pool.new_table();
        let error = table.reserve(9).unwrap_err();
        assert!(error.to_string().contains("--kv-pages"));
        assert_eq!(pool.free_pages(), 2);
        assert_eq!(table.capacity(), 0);
    }

    proptest! {
        #[test]
        fn commit_path_moves_the_path_rows_into_place_and_frees_the_rest(
            page_size in 1usize..5,
            base in 0usize..9,
            picks in proptest::collection::vec(any::<bool>(), 1..20),
            half in any::<bool>(),
        ) {
            let rows = picks.len();
            let pool = PagePool::new(64, page_size).unwrap();
            let dtype = if half { crate::KvDtype::F16 } else { crate::KvDtype::F32 };
            let mut store = KvStore::with_dtype(2, pool.num_slots(), 1, 3, dtype);
            let mut table = pool.new_table();
            table.reserve(base + rows).unwrap();
            table.append(base);
            // Row i of the tree carries the value i in every lane of every layer.
            for i in 0..base + rows {
                let value = [i as f32; 3];
                for layer in 0..2 {
                    store.write(layer, table.slot(i), &value, &value);
                }
            }
            let path: Vec<usize> = std::iter::once(0).chain((1..rows).filter(|&i| picks[i])).collect();
            table.commit_path(&mut store, base, &path);
            prop_assert_eq!(table.len(), base + path.len());
            for (m, &node) in path.iter().enumerate() {
                let (keys, values) = store.layer(1);
                let slot = table.slot(base + m);
                prop_assert_eq!(keys.get(slot * 3), (base + node) as f32);
                prop_assert_eq!(values.get(slot * 3 + 2), (base + node) as f32);
            }
            for i in 0..base {
                prop_assert_eq!(store.layer(0).0.get(table.slot(i) * 3), i as f32);
            }
            prop_assert_eq!(table.pages().len(), pool.pages_for(base + path.len()));
            prop_assert_eq!(pool.free_pages(), 64 - table.pages().len());
        }

        #[test]
        fn pages_return_to_the_pool_however_tables_end(
            page_size in 1usize..8,
            ops in proptest::collection::vec((0usize..3, 0usize..20), 1..40),
        ) {
            let pool = PagePool::new(64, page_size).unwrap();
            let mut tables: Vec<PageTable> = Vec::new();
            for (op, amount) in ops {
                match op {
                    0 => {
                        let mut table = pool.new_table();
                        if table.reserve(amount).is_ok() {
                            table.append(amount);
                        }
                        tables.push(table);
                    }
                    1 => if let Some(table) = tables.last_mut() {
                        let new_len = table.len().min(amount);
                        table.truncate(new_len);
                    },
                    _ => { tables.pop(); }
                }
                let held: usize = tables.iter().map(|t| t.pages().len()).sum();
                prop_assert_eq!(held + pool.free_pages(), 64);
            }
            drop(tables);
            prop_assert_eq!(pool.free_pages(), 64);
        }
    }
}
