//! Prefix caching across requests: a radix tree over committed pages.
//!
//! An edge holds whole pages of tokens (a multiple of `page_size` tokens) and the page ids
//! whose K/V hold them; children are keyed by their first page's tokens, so the tree is a
//! radix tree at page granularity (SGLang's RadixCache with pages). The cache is a holder of
//! its pages in the pools' reference counts, like a page table: a request whose prompt starts
//! with a cached prefix shares those pages read-only ([`crate::PageTable::share_prefix`]) and
//! writes only after them, so no copy-on-write is ever needed. Pages nothing but the cache
//! holds are evicted least recently used first, from the leaves up.
//!
//! A speculative engine keeps a second pool for its drafter's context; an edge may carry the
//! drafter's pages for a prefix of its pages (a plain request inserts none, a drafting request
//! fills them in), and a drafting request only matches as far as both exist, so a hit leaves
//! the drafter exactly as a prefill of the prefix would have.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use grove_core::TokenId;

use crate::{PageId, PagePool};

const ROOT: usize = 0;

#[derive(Debug, Default)]
struct Node {
    parent: usize,
    /// Whole pages of tokens; `pages[i]` holds `tokens[i * page_size..][..page_size]`.
    tokens: Vec<TokenId>,
    pages: Vec<PageId>,
    /// The drafter's pages for `pages[..draft_pages.len()]`.
    draft_pages: Vec<PageId>,
    children: HashMap<Vec<TokenId>, usize>,
    last_used: u64,
}

/// What a lookup found: the first `tokens` tokens are cached in `pages` (and, when asked for,
/// the drafter's context in `draft_pages`, one per page).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    pub tokens: usize,
    pub pages: Vec<PageId>,
    pub draft_pages: Vec<PageId>,
}

/// Counters since the cache was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub lookups: u64,
    /// Tokens served from the cache (summed over lookups).
    pub hit_tokens: u64,
    /// Tokens looked up (the denominator of the hit rate).
    pub queried_tokens: u64,
    pub inserted_pages: u64,
    pub evicted_pages: u64,
}

/// A radix tree over the committed pages of one target pool (and its drafter's pool).
#[derive(Debug)]
pub struct PrefixCache {
    target: PagePool,
    draft: Option<PagePool>,
    /// Slab of nodes; `None` marks a free slot. Index 0 is the root (no tokens).
    nodes: Vec<Option<Node>>,
    free_slots: Vec<usize>,
    clock: u64,
    cached_pages: usize,
    stats: PrefixCacheStats,
}

impl PrefixCache {
    /// A cache over `target` and, for a speculative engine, the drafter's `draft` pool (same
    /// page size).
    pub fn new(target: PagePool, draft: Option<PagePool>) -> Self {
        debug_assert!(draft
            .as_ref()
            .is_none_or(|d| d.page_size() == target.page_size()));
        Self {
            target,
            draft,
            nodes: vec![Some(Node::default())],
            free_slots: Vec::new(),
            clock: 0,
            cached_pages: 0,
            stats: PrefixCacheStats::default(),
        }
    }

    /// Target pages the cache holds.
    pub fn cached_pages(&self) -> usize {
        self.cached_pages
    }

    pub fn stats(&self) -> PrefixCacheStats {
        self.stats
    }

    fn node(&self, id: usize) -> &Node {
        self.nodes[id].as_ref().expect("live node")
    }

    fn node_mut(&mut self, id: usize) -> &mut Node {
        self.nodes[id].as_mut().expect("live node")
    }

    /// The longest cached prefix of `tokens[..limit]` in whole pages (only as far as the
    /// drafter's context is cached too when `with_draft`); marks it recently used. Holds
    /// nothing: share the pages into a table before anything can evict them. Counted in the
    /// statistics only through [`PrefixCache::record_lookup`].
    pub fn lookup(&mut self, tokens: &[TokenId], limit: usize, with_draft: bool) -> PrefixMatch {
        let page_size = self.target.page_size();
        let usable = limit.min(tokens.len()) / page_size * page_size;
        let tokens = &tokens[..usable];
        self.clock += 1;
        let mut found = PrefixMatch::default();
        let mut node = ROOT;
        'walk: while found.tokens < tokens.len() {
            let key = &tokens[found.tokens..found.tokens + page_size];
            let Some(&child) = self.node(node).children.get(key) else {
                break;
            };
            let clock = self.clock;
            let edge = self.node_mut(child);
            edge.last_used = clock;
            for (page, chunk) in edge.tokens.chunks(page_size).enumerate() {
                let at = found.tokens;
                if at == tokens.len() || chunk != &tokens[at..at + page_size] {
                    break 'walk;
                }
                if with_draft {
                    let Some(&draft) = edge.draft_pages.get(page) else {
                        break 'walk;
                    };
                    found.draft_pages.push(draft);
                }
                found.pages.push(edge.pages[page]);
                found.tokens += page_size;
            }
            node = child;
        }
        found
    }

    /// Counts a lookup that was used: `hit` of `queried` tokens came from the cache.
    pub fn record_lookup(&mut self, queried: usize, hit: usize) {
        self.stats.lookups += 1;
        self.stats.queried_tokens += queried as u64;
        self.stats.hit_tokens += hit as u64;
    }

    /// Caches the whole pages of `tokens` (`pages[i]` holds page `i`; `draft_pages`, when
    /// given, the drafter's context for the first of them). Pages already cached for the same
    /// tokens stay as they are (the caller's copies are not taken); the cache takes a holder
    /// of every page it keeps.
    pub fn insert(&mut self, tokens: &[TokenId], pages: &[PageId], draft_pages: &[PageId]) {
        let page_size = self.target.page_size();
        let whole = (tokens.len() / page_size).min(pages.len());
        let draft_pages = &draft_pages[..draft_pages.len().min(whole)];
        if self.draft.is_none() {
            debug_assert!(
                draft_pages.is_empty(),
                "no drafter pool to hold draft pages"
            );
        }
        self.clock += 1;
        let mut node = ROOT;
        let mut page = 0;
        while page < whole {
            let at = page * page_size;
            let key = tokens[at..at + page_size].to_vec();
            let Some(&child) = self.node(node).children.get(&key) else {
                self.add_leaf(
                    node,
                    key,
                    &tokens[at..whole * page_size],
                    page,
                    pages,
                    draft_pages,
                );
                return;
            };
            // Pages of this edge that match the tokens.
            let edge_pages = self.node(child).pages.len();
            let mut common = 0;
            while common < edge_pages
                && page + common < whole
                && self.node(child).tokens[common * page_size..][..page_size]
                    == tokens[(page + common) * page_size..][..page_size]
            {
                common += 1;
            }
            if common < edge_pages {
                self.split(child, common);
            }
            self.fill_draft_pages(child, page, draft_pages);
            self.node_mut(child).last_used = self.clock;
            page += common;
            node = child;
        }
    }

    /// Makes a new leaf under `parent` for `tokens` (pages `first..` of the insert).
    fn add_leaf(
        &mut self,
        parent: usize,
        key: Vec<TokenId>,
        tokens: &[TokenId],
        first: usize,
        pages: &[PageId],
        draft_pages: &[PageId],
    ) {
        let count = tokens.len() / self.target.page_size();
        let pages = pages[first..first + count].to_vec();
        let draft: Vec<PageId> = draft_pages.get(first..).unwrap_or_default().to_vec();
        self.target.retain(&pages);
        if let Some(pool) = &self.draft {
            pool.retain(&draft);
        }
        self.cached_pages += pages.len();
        self.stats.inserted_pages += pages.len() as u64;
        let leaf = Node {
            parent,
            tokens: tokens.to_vec(),
            pages,
            draft_pages: draft,
            children: HashMap::new(),
            last_used: self.clock,
        };
        let id = match self.free_slots.pop() {
            Some(id) => {
                self.nodes[id] = Some(leaf);
                id
            }
            None => {
                self.nodes.push(Some(leaf));
                self.nodes.len() - 1
            }
        };
        self.node_mut(parent).children.insert(key, id);
    }

    /// Extends `node`'s drafter pages with the insert's (`draft_pages[first + i]` for its page
    /// `i`) where it has none yet.
    fn fill_draft_pages(&mut self, node: usize, first: usize, draft_pages: &[PageId]) {
        let Some(pool) = self.draft.clone() else {
            return;
        };
        let edge = self.node_mut(node);
        let have = edge.draft_pages.len();
        let end = edge
            .pages
            .len()
            .min(draft_pages.len().saturating_sub(first));
        if end > have {
            let added = &draft_pages[first + have..first + end];
            pool.retain(added);
            edge.draft_pages.extend_from_slice(added);
        }
    }

    /// Cuts `node`'s edge after `pages` pages: the rest becomes its only child.
    fn split(&mut self, node: usize, pages: usize) {
        let page_size = self.target.page_size();
        let edge = self.node_mut(node);
        let tail = Node {
            parent: node,
            tokens: edge.tokens.split_off(pages * page_size),
            pages: edge.pages.split_off(pages),
            draft_pages: edge
                .draft_pages
                .split_off(pages.min(edge.draft_pages.len())),
            children: std::mem::take(&mut edge.children),
            last_used: edge.last_used,
        };
        let key = tail.tokens[..page_size].to_vec();
        let grandchildren: Vec<usize> = tail.children.values().copied().collect();
        self.nodes.push(Some(tail));
        let id = self.nodes.len() - 1;
        for child in grandchildren {
            self.node_mut(child).parent = id;
        }
        self.node_mut(node).children.insert(key, id);
    }

    /// Cached target pages nothing else holds: what [`PrefixCache::evict`] can free.
    pub fn evictable_pages(&self) -> usize {
        self.nodes
            .iter()
            .flatten()
            .flat_map(|node| &node.pages)
            .filter(|&&page| self.target.holders(page) == 1)
            .count()
    }

    /// Frees pages nothing but the cache holds, least recently used leaves first and each
    /// leaf from its end, until `target` pages of the target pool and `draft` of the
    /// drafter's have returned (or nothing more can go). Returns the target pages freed.
    pub fn evict(&mut self, target: usize, draft: usize) -> usize {
        let mut freed = (0, 0);
        let mut leaves: BinaryHeap<Reverse<(u64, usize)>> = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(id, node)| {
                let node = node.as_ref()?;
                (id != ROOT && node.children.is_empty()).then_some(Reverse((node.last_used, id)))
            })
            .collect();
        while freed.0 < target || freed.1 < draft {
            let Some(Reverse((_, id))) = leaves.pop() else {
                break;
            };
            while freed.0 < target || freed.1 < draft {
                let edge = self.node(id);
                let Some(&page) = edge.pages.last() else {
                    break;
                };
                if self.target.holders(page) > 1 {
                    break;
                }
                self.drop_last_page(id, &mut freed);
            }
            if self.node(id).pages.is_empty() {
                let parent = self.remove_leaf(id);
                let parent_node = self.node(parent);
                if parent != ROOT && parent_node.children.is_empty() {
                    leaves.push(Reverse((parent_node.last_used, parent)));
                }
            }
        }
        self.stats.evicted_pages += freed.0 as u64;
        freed.0
    }

    /// Releases the last page of leaf `id` (and its drafter page).
    fn drop_last_page(&mut self, id: usize, freed: &mut (usize, usize)) {
        let page_size = self.target.page_size();
        let edge = self.node_mut(id);
        let page = edge.pages.pop().expect("a page to drop");
        let draft = (edge.draft_pages.len() > edge.pages.len())
            .then(|| edge.draft_pages.pop())
            .flatten();
        let keep = edge.tokens.len() - page_size;
        edge.tokens.truncate(keep);
        self.target.release(&[page]);
        self.cached_pages -= 1;
        freed.0 += 1;
        if let (Some(draft), Some(pool)) = (draft, &self.draft) {
            pool.release(&[draft]);
            freed.1 += 1;
        }
    }

    /// Unlinks the emptied leaf `id`; returns its parent.
    fn remove_leaf(&mut self, id: usize) -> usize {
        let parent = self.node(id).parent;
        self.node_mut(parent)
            .children
            .retain(|_, &mut child| child != id);
        self.nodes[id] = None;
        self.free_slots.push(id);
        parent
    }

    /// Evicts everything nothing else holds (a reset; pages held by running requests stay).
    pub fn clear(&mut self) -> usize {
        self.evict(usize::MAX, usize::MAX)
    }
}

impl Drop for PrefixCache {
    fn drop(&mut self) {
        for node in self.nodes.iter().flatten() {
            self.target.release(&node.pages);
            if let Some(pool) = &self.draft {
                pool.release(&node.draft_pages);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;
    use crate::PageTable;

    /// A request as the engine runs one: share the cached prefix, "prefill" the rest into
    /// fresh pages (recording which tokens each page now holds), cache the whole pages.
    fn run_request(
        cache: &mut PrefixCache,
        pool: &PagePool,
        contents: &mut HashMap<PageId, Vec<TokenId>>,
        tokens: &[TokenId],
    ) -> Option<PageTable> {
        let page_size = pool.page_size();
        let found = cache.lookup(tokens, tokens.len().saturating_sub(1), false);
        let mut table = pool.new_table();
        table.share_prefix(&found.pages);
        let missing = table.pages_missing(tokens.len() - found.tokens);
        if missing > pool.free_pages() {
            cache.evict(missing - pool.free_pages(), 0);
        }
        table.reserve(tokens.len() - found.tokens).ok()?;
        table.append(tokens.len() - found.tokens);
        for (index, &page) in table.pages().iter().enumerate().skip(found.pages.len()) {
            let start = index * page_size;
            let end = tokens.len().min(start + page_size);
            contents.insert(page, tokens[start..end].to_vec());
        }
        cache.insert(tokens, table.pages(), &[]);
        Some(table)
    }

    proptest! {
        #[test]
        fn hits_hold_the_tokens_they_claim_and_every_page_is_accounted_for(
            page_size in 1usize..4,
            total_pages in 6usize..40,
            requests in proptest::collection::vec(
                (proptest::collection::vec(0u32..3, 1..14), any::<bool>(), 0usize..4),
                1..30,
            ),
        ) {
            let pool = PagePool::new(total_pages, page_size).unwrap();
            let mut cache = PrefixCache::new(pool.clone(), None);
            let mut contents = HashMap::new();
            let mut held: Vec<PageTable> = Vec::new();
            for (tokens, keep, evict) in requests {
                let found = cache.lookup(&tokens, tokens.len(), false);
                prop_assert_eq!(found.tokens % page_size, 0);
                for (index, page) in found.pages.iter().enumerate() {
                    let start = index * page_size;
                    prop_assert_eq!(&contents[page], &tokens[start..start + page_size].to_vec());
                }
                if let Some(table) = run_request(&mut cache, &pool, &mut contents, &tokens) {
                    if keep {
                        held.push(table);
                    }
                }
                cache.evict(evict, 0);
                // Every page is free, or held by a live table or the cache.
                let mut holders: HashMap<PageId, u32> = HashMap::new();
                for table in &held {
                    for &page in table.pages() {
                        *holders.entry(page).or_default() += 1;
                    }
                }
                for node in cache.nodes.iter().flatten() {
                    for &page in &node.pages {
                        *holders.entry(page).or_default() += 1;
                    }
                }
                for page in 0..total_pages as PageId {
                    prop_assert_eq!(pool.holders(page), holders.get(&page).copied().unwrap_or(0));
                }
                prop_assert_eq!(pool.free_pages() + holders.len(), total_pages);
                prop_assert_eq!(
                    cache.cached_pages(),
                    cache.nodes.iter().flatten().map(|n| n.pages.len()).sum::<usize>()
                );
            }
            drop(held);
            prop_assert_eq!(cache.evictable_pages(), cache.cached_pages());
            cache.clear();
            prop_assert_eq!(cache.cached_pages(), 0);
            prop_assert_eq!(pool.free_pages(), total_pages);
        }
    }

    #[test]
    fn a_lookup_stops_at_a_mismatch_inside_an_edge_and_an_insert_splits_it() {
        let pool = PagePool::new(16, 2).unwrap();
        let mut cache = PrefixCache::new(pool.clone(), None);
        let mut contents = HashMap::new();
        let first = run_request(&mut cache, &pool, &mut contents, &[1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(cache.cached_pages(), 3);
        let found = cache.lookup(&[1, 2, 3, 4, 9, 9, 9], 7, false);
        assert_eq!(found.tokens, 4);
        assert_eq!(found.pages, first.as_ref().unwrap().pages()[..2]);
        let second = run_request(&mut cache, &pool, &mut contents, &[1, 2, 3, 4, 9, 9, 9]);
        // The shared two pages, then the second request's own.
        assert_eq!(second.unwrap().pages()[..2], first.unwrap().pages()[..2]);
        assert_eq!(cache.cached_pages(), 4);
        assert_eq!(cache.node(ROOT).children.len(), 1);
        // Nothing is evicted while a table holds it; unheld pages go least recently used first.
        assert_eq!(cache.evictable_pages(), 4);
        cache.lookup(&[1, 2, 3, 4, 9, 9], 6, false);
        assert_eq!(cache.evict(1, 0), 1);
        assert_eq!(cache.lookup(&[1, 2, 3, 4, 5, 6], 6, false).tokens, 4);
        assert_eq!(cache.lookup(&[1, 2, 3, 4, 9, 9], 6, false).tokens, 6);
    }

    #[test]
    fn a_drafting_lookup_matches_only_as_far_as_the_drafters_pages() {
        let pool = PagePool::new(8, 1).unwrap();
        let draft_pool = PagePool::new(8, 1).unwrap();
        let mut cache = PrefixCache::new(pool.clone(), Some(draft_pool.clone()));
        let mut table = pool.new_table();
        table.reserve(4).unwrap();
        table.append(4);
        cache.insert(&[1, 2, 3, 4], table.pages(), &[]);
        assert_eq!(cache.lookup(&[1, 2, 3, 4], 4, true).tokens, 0);
        let mut drafts = draft_pool.new_table();
        drafts.reserve(2).unwrap();
        drafts.append(2);
        cache.insert(&[1, 2, 3, 4], table.pages(), drafts.pages());
        let found = cache.lookup(&[1, 2, 3, 4], 4, true);
        assert_eq!(found.tokens, 2);
        assert_eq!(found.draft_pages, drafts.pages());
        assert_eq!(cache.lookup(&[1, 2, 3, 4], 4, false).tokens, 4);
        drop((table, drafts));
        cache.clear();
        assert_eq!(pool.free_pages(), 8);
        assert_eq!(draft_pool.free_pages(), 8);
    }
}
