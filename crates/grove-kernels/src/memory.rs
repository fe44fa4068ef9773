//! The OS calls of loading: read-only maps of checkpoint files, handing freed heap back, and
//! keeping a forward pass's large buffers in the heap between uses.
//! They sit here because they are `unsafe` and this is the one crate allowed to be.
#![allow(unsafe_code)]

use std::fs::File;
use std::path::PathBuf;

use candle_core::safetensors::MmapedSafetensors;

/// `file` mapped read-only, in 4 KiB pages: the file's page cache may hold 2 MiB folios
/// (readahead makes them on recent kernels), and mapping one whole where a few embedding rows
/// are looked up made it resident for each row.
pub fn map_read_only(file: &File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: mapped read-only; like every mmap-based loader we rely on no other process
    // truncating the file while it is mapped.
    let map = unsafe { memmap2::Mmap::map(file) }?;
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::NoHugePage);
    Ok(map)
}

/// The safetensors files `files` (one checkpoint's shards), mapped read-only.
pub fn map_safetensors(files: &[PathBuf]) -> candle_core::Result<MmapedSafetensors> {
    // SAFETY: as for `map_read_only`.
    unsafe { MmapedSafetensors::multi(files) }
}

/// Hands heap memory that was freed back to the OS. glibc keeps freed small blocks resident;
/// reading a GGUF file's metadata and building its tokenizer frees ~120 MB of them for a
/// 262k-entry vocabulary (Gemma 3: strings for every token and 513k merges), which stayed in
/// the process's RSS next to the mapped weights. Call it once loading is done.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: glibc's malloc_trim takes any padding and only touches its own free lists.
        unsafe {
            malloc_trim(0);
        }
    }
}

/// Keeps the large buffers of forward passes in the heap once they are freed, for the next
/// pass to reuse. glibc gives a block past its mmap threshold (128 KiB at first, then the
/// largest such block freed, up to 32 MiB) a mapping of its own and unmaps it when freed, and
/// trims the heap's top past twice that threshold, so a 512-token prefill's activations (a
/// layer's gated MLP output is 18 MB on Qwen2.5-1.5B) were mapped, faulted in page by page
/// and unmapped again, layer after layer (page faults and unmapping in the prefill's
/// profile, serial stretches on the thread that posts the parallel sections). Here
/// blocks up to 32 MiB come from the heap, and the heap is trimmed only where
/// [`release_freed_memory`] asks: what stays resident is the largest pass's working set.
/// Call it once, before loading. Returns whether the allocator took both settings (not
/// where it is not glibc's).
pub fn keep_freed_buffers() -> bool {
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    return false;
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
        }
        const M_TRIM_THRESHOLD: std::ffi::c_int = -1;
        const M_MMAP_THRESHOLD: std::ffi::c_int = -3;
        // glibc's largest mmap threshold (`HEAP_MAX_SIZE / 2` on 64-bit).
        const MOST_FROM_HEAP: std::ffi::c_int = 32 << 20;
        // SAFETY: glibc's mallopt only sets its allocator's tunables; both values are in the
        // ranges it accepts (it returns 0 and changes nothing otherwise).
        unsafe {
            mallopt(M_MMAP_THRESHOLD, MOST_FROM_HEAP) == 1
                && mallopt(M_TRIM_THRESHOLD, std::ffi::c_int::MAX) == 1
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    #[test]
    fn a_mapped_file_reads_its_bytes() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(b"grove").unwrap();
        let map = super::map_read_only(file.as_file()).unwrap();
        assert_eq!(&map[..], b"grove");
    }
}
