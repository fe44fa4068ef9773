//! Where the kernels' copies of weight matrices live (the layouts made at load): large
//! anonymous mappings backed by 2 MiB pages, the matrices packed one after another.
//!
//! A decode step streams every weight once, and every 4 KiB page it crosses is a TLB miss and
//! a page walk (the core's second-level TLB covers 8 MiB of 4 KiB pages; a Qwen2.5-0.5B step
//! reads 392 MB). A mapping of its own per matrix, even asked for huge pages, got them only
//! for the 2 MiB-aligned stretches inside it: a 0.7 MB q/k/v matrix none, a 3 MB MLP matrix
//! one or two, 52% of that model's weights in all. Packed into 2 MiB-aligned chunks, all of
//! them are (where the kernel has huge pages to give), and the unused tail of a chunk is never
//! touched, so never resident. Two copies of that model in one process, decode steps
//! alternating between them: 18.2-18.7 ms a step with every weight in huge pages, against
//! 19.8-20.8 with a mapping per matrix.
// Raw pointers into the chunks: a region is written through its one handle, then only read.
#![allow(unsafe_code)]

use std::sync::{Arc, Mutex};

/// Huge page size (x86-64, aarch64 with 4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;
/// Bytes of a chunk (a larger matrix gets a chunk of its own size).
const CHUNK_BYTES: usize = 64 << 20;
/// Where each matrix starts within a chunk: on a page of its own, as a mapping of its own did.
const ALIGN: usize = 4096;

/// One mapping, of which `len` bytes from the first huge page boundary are handed out.
pub struct Chunk {
    map: memmap2::MmapRaw,
    start: usize,
}

impl Chunk {
    fn new(len: usize) -> std::io::Result<Self> {
        // One huge page more than needed, so that the used part can start on a boundary (the
        // untouched head is never resident).
        let map = memmap2::MmapRaw::from(memmap2::MmapMut::map_anon(len + HUGE_PAGE)?);
        // (Miri has no `madvise`: its pages are not the kernel's anyway.)
        #[cfg(all(target_os = "linux", not(miri)))]
        let _ = map.advise(memmap2::Advice::HugePage);
        let address = map.as_ptr() as usize;
        Ok(Self {
            start: address.next_multiple_of(HUGE_PAGE) - address,
            map,
        })
    }

    /// `len` bytes at `offset` of the part handed out.
    ///
    /// # Safety
    /// The range was handed out by [`allocate`] (inside the chunk) and is no longer written.
    pub unsafe fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        // SAFETY: inside the mapping (the caller's range came from `allocate`), and nothing
        // writes it any more.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(self.start + offset), len) }
    }
}

/// The bytes of a chunk handed out for one matrix's copy: written through
/// [`Region::bytes_mut`] while the region is the only handle to them, then read-only (through
/// [`Chunk::bytes`]) once [`Region::into_parts`] gives them away.
pub struct Region {
    chunk: Arc<Chunk>,
    offset: usize,
    len: usize,
}

impl Region {
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `allocate` handed `offset..offset + len` of the chunk to this region only,
        // and the region is not `Clone`: this is the only reference to those bytes.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.chunk
                    .map
                    .as_mut_ptr()
                    .add(self.chunk.start + self.offset),
                self.len,
            )
        }
    }

    /// The chunk, the offset and the length, for reading from now on.
    pub fn into_parts(self) -> (Arc<Chunk>, usize, usize) {
        (self.chunk, self.offset, self.len)
    }
}

/// `len` zeroed bytes (fresh anonymous memory) of the chunk being filled, or of a new one.
pub fn allocate(len: usize) -> std::io::Result<Region> {
    /// The chunk being filled and how much of it is handed out.
    static CURRENT: Mutex<Option<(Arc<Chunk>, usize)>> = Mutex::new(None);
    let mut current = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
    let fits = |(chunk, used): &(Arc<Chunk>, usize)| {
        used.next_multiple_of(ALIGN) + len <= chunk.map.len() - HUGE_PAGE
    };
    if !current.as_ref().is_some_and(fits) {
        let chunk = Arc::new(Chunk::new(
            len.next_multiple_of(HUGE_PAGE).max(CHUNK_BYTES),
        )?);
        *current = Some((chunk, 0));
    }
    let (chunk, used) = current.as_mut().expect("a chunk with room");
    let offset = used.next_multiple_of(ALIGN);
    // Handed out once: the next region starts past it.
    *used = offset + len;
    Ok(Region {
        chunk: Arc::clone(chunk),
        offset,
        len,
    })
}

#[cfg(test)]
mod tests {
    use super::{allocate, ALIGN, CHUNK_BYTES, HUGE_PAGE};

    #[test]
    fn regions_are_zeroed_aligned_disjoint_and_outlive_their_neighbours() {
        // Small regions (sharing chunks with each other and with other tests'), and one
        // larger than a chunk (a chunk of its own).
        let sizes = [1, 4095, 4097, 100_000, CHUNK_BYTES + 1, 3];
        let mut regions: Vec<_> = sizes.iter().map(|&len| allocate(len).unwrap()).collect();
        for (i, region) in regions.iter_mut().enumerate() {
            let bytes = region.bytes_mut();
            assert!(bytes.iter().all(|&b| b == 0), "fresh memory is zeroed");
            assert_eq!(bytes.as_ptr() as usize % ALIGN, 0);
            bytes.fill(i as u8 + 1);
        }
        let mut parts: Vec<_> = regions.into_iter().map(|r| r.into_parts()).collect();
        let (big, _, _) = &parts[4];
        // SAFETY (here and below): ranges from `allocate`, no longer written.
        assert_eq!(
            unsafe { big.bytes(0, 1) }.as_ptr() as usize % HUGE_PAGE,
            0,
            "a chunk's first region starts on a huge page"
        );
        // Dropping some regions' handles leaves the others readable, each its own bytes.
        parts.remove(0);
        parts.remove(2);
        for ((chunk, offset, len), value) in parts.iter().zip([2u8, 3, 5, 6]) {
            let bytes = unsafe { chunk.bytes(*offset, *len) };
            assert!(bytes.iter().all(|&b| b == value), "region {value}");
        }
    }
}
