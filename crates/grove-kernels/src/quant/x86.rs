//! What both AVX-512 kernel families (`simd.rs`, `simd32.rs`) read through: raw pointers to
//! a tile's activation rows, the weights' prefetches, and the four-way horizontal sum.
// SAFETY (all of the module): as in `simd.rs`: compiled for the features `simd::available`
// checks and reached only after it did; the pointers are inside rows the callers sized.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::interleave;
use super::{QuantizedRows, CHUNK, LANES};

/// How far ahead of the chunk being multiplied its weights are requested (`prefetch`). The
/// hardware prefetcher alone left one row of decoding at 7.4 GB/s per core on a 151936 x 896
/// Q8_0 head (the memory test reads 9-10); asking 3 KiB ahead brought both threads to 21 GB/s.
/// Measured here with 512 B to 8 KiB: 2-4 KiB best for every format.
pub(super) const PREFETCH: usize = 3072;
/// How far ahead the weights are requested into L2 only (a second `prefetch`, `prefetcht1`).
/// A core's stream is bound by the misses it has in flight; requests into L2 add to those of
/// the L1 requests above. A plain two-thread read of 1 GiB here: 14-24 GB/s with the L1
/// requests alone, 24-29 with these 16 KiB ahead as well (8-32 KiB alike); a 300000 x 896
/// Q5_0 product from memory on two threads: 8.9-9.7 -> 6.3-6.8 ms (with the lane-blocked
/// layout, which alone did not move it).
pub(super) const PREFETCH_L2: usize = 16384;

/// Raw pointers to `R` activation rows, so the inner loops do no slicing.
pub(super) struct Rows<const R: usize> {
    pub(super) scale: [*const f32; R],
    pub(super) q6k_zero: [*const i32; R],
    pub(super) scaled_sum32: [*const f32; R],
    pub(super) lanes: [*const i8; R],
    pub(super) lane_sums: [*const i32; R],
    pub(super) q4k: [*const i8; R],
    pub(super) q6k: [*const i8; R],
}

impl<const R: usize> Rows<R> {
    /// Rows `start..start + R`, which the caller guarantees exist. Plain pointer offsets: this
    /// runs once per weight row and tile, so slicing here showed up in prefill profiles.
    pub(super) fn new(acts: &QuantizedRows, start: usize) -> Self {
        debug_assert!((start + R) * acts.k <= acts.q.len());
        let k = acts.k;
        let offset = |r: usize, per_row: usize| (start + r) * per_row;
        let lane_sums = interleave::group_count(k / CHUNK) * LANES;
        Self {
            scale: std::array::from_fn(|r| {
                acts.scale.as_ptr().wrapping_add(offset(r, k / acts.block))
            }),
            q6k_zero: std::array::from_fn(|r| {
                acts.q6k_zero.as_ptr().wrapping_add(offset(r, k / 16))
            }),
            scaled_sum32: std::array::from_fn(|r| {
                acts.scaled_sum32.as_ptr().wrapping_add(offset(r, k / 32))
            }),
            lanes: std::array::from_fn(|r| acts.lanes.as_ptr().wrapping_add(offset(r, k))),
            lane_sums: std::array::from_fn(|r| {
                acts.lane_sums.as_ptr().wrapping_add(offset(r, lane_sums))
            }),
            q4k: std::array::from_fn(|r| acts.q4k.as_ptr().wrapping_add(offset(r, k))),
            q6k: std::array::from_fn(|r| acts.q6k.as_ptr().wrapping_add(offset(r, k))),
        }
    }
}

/// The horizontal sums of four vectors, as the four lanes of one: halves folded pairwise
/// across the vectors, then within 128-bit lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn reduce4(v: [__m512; 4]) -> __m128 {
    // [v0 q0+q2, v0 q1+q3, v1 q0+q2, v1 q1+q3] (quarters of 4 lanes), and the same for v2, v3.
    let fold = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
        )
    };
    let (v01, v23) = (fold(v[0], v[1]), fold(v[2], v[3]));
    // Quarter i: four partial sums of v_i.
    let t = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(v01, v23),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(v01, v23),
    );
    let t = _mm512_add_ps(t, _mm512_permute_ps::<0b10_11_00_01>(t));
    let t = _mm512_add_ps(t, _mm512_permute_ps::<0b01_00_11_10>(t));
    // Lane 0 of each quarter holds its total.
    _mm512_castps512_ps128(_mm512_permutexvar_ps(
        _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0),
        t,
    ))
}

/// Asks for the cache lines [`PREFETCH`] bytes past `bytes..bytes + len` (the weights a
/// few blocks on).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn prefetch(bytes: *const u8, len: usize) {
    prefetch_at::<_MM_HINT_T0>(bytes.wrapping_add(PREFETCH), len);
    prefetch_at::<_MM_HINT_T1>(bytes.wrapping_add(PREFETCH_L2), len);
}

/// Asks for the cache lines of `bytes..bytes + len` (into the caches `HINT` names).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn prefetch_at<const HINT: i32>(bytes: *const u8, len: usize) {
    let mut at = 0;
    while at < len {
        _mm_prefetch::<HINT>(bytes.wrapping_add(at).cast());
        at += 64;
    }
}
