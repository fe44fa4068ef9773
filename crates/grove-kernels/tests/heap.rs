//! `memory::keep_freed_buffers` in a process of its own: the test below reads glibc's count
//! of mapped bytes, which other tests' allocations in the same process would move.
#![allow(unsafe_code)]

/// glibc takes both settings (it refuses an mmap threshold past 32 MiB), and then a 30 MiB
/// block comes from the heap, where under a 1 MiB threshold (set first, so that the test does
/// not depend on what the process freed before) it got a mapping of its own: glibc's count of
/// mapped bytes grows by the block under the one and not the other.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn large_buffers_come_from_the_heap() {
    /// glibc's `struct mallinfo2` (2.33 and later): ten `size_t` counters.
    #[repr(C)]
    struct MallInfo2 {
        arena: usize,
        ordblks: usize,
        smblks: usize,
        hblks: usize,
        hblkhd: usize,
        usmblks: usize,
        fsmblks: usize,
        uordblks: usize,
        fordblks: usize,
        keepcost: usize,
    }
    extern "C" {
        fn mallinfo2() -> MallInfo2;
        fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
    }
    const BLOCK: usize = 30 << 20;
    // How many bytes of mapped blocks a new 30 MiB block adds.
    let mapped_by_a_block = || {
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let before = unsafe { mallinfo2() }.hblkhd;
        // Seen as used, so that the allocation is not optimized away.
        let block = std::hint::black_box(vec![1u8; BLOCK]);
        let after = unsafe { mallinfo2() }.hblkhd;
        drop(block);
        after.saturating_sub(before)
    };
    // SAFETY: glibc's mallopt only sets its allocator's tunables (M_MMAP_THRESHOLD, 1 MiB).
    assert_eq!(unsafe { mallopt(-3, 1 << 20) }, 1);
    assert!(
        mapped_by_a_block() >= BLOCK,
        "under 1 MiB the block is mapped"
    );
    assert!(grove_kernels::memory::keep_freed_buffers());
    assert!(
        mapped_by_a_block() < BLOCK,
        "a 30 MiB block was mapped on its own"
    );
}
