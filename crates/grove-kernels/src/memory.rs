//! The OS calls of loading: read-only maps of checkpoint files and handing freed heap back.
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
