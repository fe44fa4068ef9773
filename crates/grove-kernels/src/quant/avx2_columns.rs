//! The AVX2 kernels of the column layout (`columns.rs`), for CPUs without AVX-512 VNNI (AMD
//! Zen 3 and older, Intel client cores): the same strips as `simd_columns.rs`, read half a
//! vector at a time.
//!
//! A 256-bit register holds half of a group's vector: the same four weights of eight rows. Its
//! product with an activation row's four bytes broadcast is `vpmaddubsw` (unsigned weights
//! times signed activations, adjacent pairs summed to 16 bits) then `vpmaddwd` by ones (the
//! pairs summed to 32 bits: one lane per weight row), so as in the VNNI kernel a block's sums
//! end in the lanes of eight outputs and nothing is reduced horizontally. Where the weights
//! are small the 16-bit pair sums of several groups are added before widening (`ADD` groups:
//! no sum can reach the 16-bit limit, see [`Format::ADD`]), which saves most of the widening.
//! A strip is passed twice, rows 0-7 then rows 8-15: the second pass reads it from L2 (a
//! strip is at most a few hundred KiB), and each pass keeps one accumulator per activation row.
//!
//! Q8_0's weights fill a byte, so `u * x` pairs could pass the 16-bit limit: they are taken as
//! signed `q = u - 128` and multiplied as `|q| * (x signed like q)` (`vpsignb`), each pair at
//! most 2 * 128 * 127, and their sums start at zero rather than at the zero point's term.
// SAFETY (all of the module): every function is compiled for AVX2, FMA and F16C, which
// `cpu::Level::Avx2` has, and reached only where that level is allowed (`Kernel::detect`);
// every pointer is inside a strip `QMatrix::new` sized or an activation row
// `QuantizedRows::new` sized, which `Share::new` asserts.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::columns::{at, STRIP, VECTOR};
use super::simd::prefetch;
use super::simd_columns::{Acts, Share};
use super::{columns, Kernel, QuantFormat, QuantizedRows};

/// Rows of a strip in one pass: the 32-bit lanes of a 256-bit vector.
const HALF: usize = STRIP / 2;
/// Bytes of half a group's vector.
const HALF_VECTOR: usize = VECTOR / 2;

/// The activation rows' four bytes at `at` broadcast to every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn broadcast<const R: usize>(x: &Acts<R>, r: usize, at: usize) -> __m256i {
    _mm256_set1_epi32(x.q[r].add(at).cast::<i32>().read_unaligned())
}

/// `G` groups (from activation offset `at`) into each row's integer sums, which start at
/// `start`; `u(g)` gives group `g`'s half vector (unsigned weights, or with `SIGNED` signed
/// ones, multiplied as `|q| * sign(x, q)`). Every `ADD` groups' 16-bit sums are widened once.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots<const R: usize, const G: usize, const ADD: usize, const SIGNED: bool>(
    start: [__m256i; R],
    x: &Acts<R>,
    at: usize,
    u: impl Fn(usize) -> __m256i,
) -> [__m256i; R] {
    let ones = _mm256_set1_epi16(1);
    let mut sums = start;
    for chunk in 0..G / ADD {
        let mut pairs = [_mm256_setzero_si256(); R];
        for g in ADD * chunk..ADD * (chunk + 1) {
            let u = u(g);
            let weights = if SIGNED { _mm256_abs_epi8(u) } else { u };
            for r in 0..R {
                let mut values = broadcast(x, r, at + 4 * g);
                if SIGNED {
                    values = _mm256_sign_epi8(values, u);
                }
                let products = _mm256_maddubs_epi16(weights, values);
                pairs[r] = if ADD == 1 {
                    products
                } else {
                    _mm256_add_epi16(pairs[r], products)
                };
            }
        }
        for r in 0..R {
            sums[r] = _mm256_add_epi32(sums[r], _mm256_madd_epi16(pairs[r], ones));
        }
    }
    sums
}

/// Each row's sums starting where block `index`'s zero point puts them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn zero_start<const R: usize>(x: &Acts<R>, index: usize) -> [__m256i; R] {
    std::array::from_fn(|r| _mm256_set1_epi32(*x.zero[r].add(index)))
}

/// 8 f16 at `p` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn halves(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
}

/// 8 bytes at `p` (unsigned, or signed where `SIGNED`) as f32 times `d`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn byte_scales<const SIGNED: bool>(p: *const u8, d: __m256) -> __m256 {
    let bytes = _mm_loadl_epi64(p.cast());
    let ints = if SIGNED {
        _mm256_cvtepi8_epi32(bytes)
    } else {
        _mm256_cvtepu8_epi32(bytes)
    };
    _mm256_mul_ps(_mm256_cvtepi32_ps(ints), d)
}

/// Group `g` of the 8 groups of 32 weights in 4 nibble vectors at `p` (low nibbles groups
/// 0-3, high 4-7). Each group is loaded where it is used: sixteen registers cannot hold all
/// eight beside a tile's sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibble_group(p: *const u8, g: usize) -> __m256i {
    let mask = _mm256_set1_epi8(0x0F);
    let v = _mm256_loadu_si256(p.add(VECTOR * (g % 4)).cast());
    if g < 4 {
        _mm256_and_si256(v, mask)
    } else {
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask)
    }
}

/// 32 bits as 32 bytes: byte `i` is `value` where bit `i` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bits_to_bytes(bits: u32, value: __m256i) -> __m256i {
    // Each 128-bit lane holds all four bytes; byte i takes byte i / 8 (lane 1: 2 and 3).
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        ),
    );
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
    _mm256_and_si256(set, value)
}

/// One format's unit (`columns::unit_bytes`) of half a strip (its rows `8h..8h + 8`, the
/// unit's vectors already offset to that half) against `R` activation rows, added into the
/// rows' 8 outputs.
trait Format {
    const FORMAT: QuantFormat;
    /// Groups whose 16-bit pair sums may be added before widening: with weights below `w`
    /// and activations of at most 127 a pair is below `2 w 127`, and `ADD` of them must stay
    /// under 2^15.
    const ADD: usize;
    unsafe fn unit<const R: usize>(
        unit: *const u8,
        half: usize,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m256; R],
    );
}

struct Q8_0;
struct Q5_0;
struct Q4K;
struct Q6K;

/// The two 32-weight blocks of a Q8_0 or Q5_0 unit: `sums(b, block)` gives block `b`'s
/// integer sums (`block` counts from the row's start), scaled into `acc` by the 8 rows' scales
/// and each row's activation scale of the block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_pair<const R: usize>(
    unit: *const u8,
    half: usize,
    i: usize,
    x: &Acts<R>,
    acc: &mut [__m256; R],
    sums: impl Fn(usize, usize) -> [__m256i; R],
) {
    for b in 0..2 {
        let block = 2 * i + b;
        let sums = sums(b, block);
        let d = halves(unit.add(at::block_scales(b) + 2 * HALF * half));
        for r in 0..R {
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(*x.scale[r].add(block)));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), scale, acc[r]);
        }
    }
}

impl Format for Q8_0 {
    const FORMAT: QuantFormat = QuantFormat::Q8_0;
    // Signed, `|q| <= 128`: one group's pairs, 2 * 128 * 127, is all 16 bits hold.
    const ADD: usize = 1;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unit<const R: usize>(
        unit: *const u8,
        half: usize,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m256; R],
    ) {
        let flip = _mm256_set1_epi8(-128);
        block_pair(unit, half, i, x, acc, |b, block| {
            let vectors = unit.add(at::q8_block(b) + HALF_VECTOR * half);
            let zero = [_mm256_setzero_si256(); R];
            dots::<R, 8, { Self::ADD }, true>(zero, x, 32 * block, |g| {
                // Stored as q + 128: the sign bit flipped back.
                _mm256_xor_si256(_mm256_loadu_si256(vectors.add(VECTOR * g).cast()), flip)
            })
        });
    }
}

impl Format for Q5_0 {
    const FORMAT: QuantFormat = QuantFormat::Q5_0;
    // u < 32: 4 * 2 * 31 * 127 < 2^15.
    const ADD: usize = 4;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unit<const R: usize>(
        unit: *const u8,
        half: usize,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m256; R],
    ) {
        let sixteen = _mm256_set1_epi8(16);
        block_pair(unit, half, i, x, acc, |b, block| {
            let start = zero_start::<R>(x, block);
            let quants = unit.add(at::q5_block(b));
            let low = quants.add(HALF_VECTOR * half);
            // Bit p of group g's word is the fifth bit of the vector's byte p: this half's are
            // the word's 32 bits at 4 * half bytes.
            let bits = quants.add(at::Q5_BITS + 4 * half).cast::<u32>();
            dots::<R, 8, { Self::ADD }, false>(start, x, 32 * block, |g| {
                let fifth = bits.add(2 * g).read_unaligned();
                _mm256_or_si256(nibble_group(low, g), bits_to_bytes(fifth, sixteen))
            })
        });
    }
}

impl Format for Q4K {
    const FORMAT: QuantFormat = QuantFormat::Q4K;
    // u < 16: 8 * 2 * 15 * 127 < 2^15.
    const ADD: usize = 8;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unit<const R: usize>(
        unit: *const u8,
        half: usize,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m256; R],
    ) {
        let rows = 2 * HALF * half;
        let (d, dmin) = (
            halves(unit.add(at::D + rows)),
            halves(unit.add(at::DMIN + rows)),
        );
        for j in 0..8 {
            let scales = byte_scales::<false>(unit.add(at::q4k_scales(j) + HALF * half), d);
            let mins = byte_scales::<false>(unit.add(at::q4k_mins(j) + HALF * half), dmin);
            let quants = unit.add(at::q4k_quants(j) + HALF_VECTOR * half);
            let zero = [_mm256_setzero_si256(); R];
            let sums = dots::<R, 8, { Self::ADD }, false>(zero, x, 256 * i + 32 * j, |g| {
                nibble_group(quants, g)
            });
            // Scaled per sub-block, the activation scale included (no second accumulator per
            // row: the registers hold the tile's sums).
            for r in 0..R {
                let scale = _mm256_mul_ps(scales, _mm256_set1_ps(*x.scale[r].add(i)));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), scale, acc[r]);
                let x_sum = _mm256_set1_ps(*x.scaled_sum32[r].add(8 * i + j));
                acc[r] = _mm256_fnmadd_ps(mins, x_sum, acc[r]);
            }
        }
    }
}

impl Format for Q6K {
    const FORMAT: QuantFormat = QuantFormat::Q6K;
    // u < 64: 2 * 2 * 63 * 127 < 2^15.
    const ADD: usize = 2;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unit<const R: usize>(
        unit: *const u8,
        half: usize,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m256; R],
    ) {
        let d = halves(unit.add(at::D + 2 * HALF * half));
        let tops_mask = _mm256_set1_epi8(0x30);
        for j in 0..8 {
            let quants = unit.add(at::q6k_quants(j) + HALF_VECTOR * half);
            // Group g's two top bits (bits 2 (g mod 4) of its tops vector) moved to bits 4-5,
            // then joined to its low nibble.
            let u = |g: usize| {
                let t = _mm256_loadu_si256(quants.add(at::Q6_TOPS + VECTOR * (g / 4)).cast());
                let moved = match g % 4 {
                    0 => _mm256_slli_epi16::<4>(t),
                    1 => _mm256_slli_epi16::<2>(t),
                    2 => t,
                    _ => _mm256_srli_epi16::<2>(t),
                };
                _mm256_or_si256(nibble_group(quants, g), _mm256_and_si256(moved, tops_mask))
            };
            for sub_half in 0..2 {
                // Sub-block 2j + sub_half: 16 weights, zero point 32.
                let sub = 2 * j + sub_half;
                let scales = byte_scales::<true>(unit.add(at::q6k_scales(sub) + HALF * half), d);
                let start = zero_start::<R>(x, 16 * i + sub);
                let sums = dots::<R, 4, { Self::ADD }, false>(start, x, 256 * i + 16 * sub, |g| {
                    u(4 * sub_half + g)
                });
                for r in 0..R {
                    let scale = _mm256_mul_ps(scales, _mm256_set1_ps(*x.scale[r].add(i)));
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), scale, acc[r]);
                }
            }
        }
    }
}

/// The share's strips against its activation rows `start..start + R`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn strips<F: Format, const R: usize>(share: &Share<'_>, start: usize) {
    let x = Acts::<R>::new(share.acts, F::FORMAT, share.first + start);
    let units = share.acts.k / columns::unit_weights(F::FORMAT);
    let unit_bytes = columns::unit_bytes(F::FORMAT);
    let out = share.out.add(start * share.stride);
    for s in 0..share.count {
        let strip = share.strips.add(s * units * unit_bytes);
        let rows = if s + 1 == share.count {
            share.last
        } else {
            STRIP
        };
        for half in 0..rows.div_ceil(HALF) {
            let mut acc = [_mm256_setzero_ps(); R];
            for i in 0..units {
                let unit = strip.add(i * unit_bytes);
                // The first pass brings the strip in; the second finds it in L2.
                if half == 0 {
                    prefetch(unit, unit_bytes);
                }
                F::unit::<R>(unit, half, i, &x, &mut acc);
            }
            let written = (rows - HALF * half).min(HALF);
            for r in 0..R {
                let mut lanes = [0f32; HALF];
                _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r]);
                let to = out.add(r * share.stride + STRIP * s + HALF * half);
                std::ptr::copy_nonoverlapping(lanes.as_ptr(), to, written);
            }
        }
    }
}

/// [`strips`] for activation rows `0..rows` of the share, in tiles of 4, 2 and 1 (a tile's
/// sums, 16-bit pairs and accumulators fill the 16 registers at 4).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiles<F: Format>(share: &Share<'_>, rows: usize) {
    let mut done = 0;
    while done < rows {
        done += match rows - done {
            4.. => {
                strips::<F, 4>(share, done);
                4
            }
            2.. => {
                strips::<F, 2>(share, done);
                2
            }
            _ => {
                strips::<F, 1>(share, done);
                1
            }
        };
    }
}

/// `out[r * stride + j]` = weight row `j` of the strips in `bytes` (`j < outputs`) dotted with
/// activation row `first + r`, for `r < rows`: `simd_columns::dot_strips` in AVX2.
#[allow(clippy::too_many_arguments)]
pub(super) fn dot_strips(
    format: QuantFormat,
    bytes: &[u8],
    outputs: usize,
    acts: &QuantizedRows,
    first: usize,
    rows: usize,
    out: &mut [f32],
    stride: usize,
) {
    let share = Share::new(
        Kernel::Avx2,
        format,
        bytes,
        outputs,
        acts,
        first,
        rows,
        out,
        stride,
    );
    // SAFETY: the caller (Kernel::detect) checked the features; `Share::new` checked that
    // `bytes` holds whole strips of `k`-weight rows, that rows `first..first + rows` exist in
    // `acts`, quantized for `format`, and that every row's `outputs` columns are inside `out`;
    // every store writes only the strip's rows that exist.
    unsafe {
        match format {
            QuantFormat::Q8_0 => tiles::<Q8_0>(&share, rows),
            QuantFormat::Q5_0 => tiles::<Q5_0>(&share, rows),
            QuantFormat::Q4K => tiles::<Q4K>(&share, rows),
            QuantFormat::Q6K => tiles::<Q6K>(&share, rows),
        }
    }
}
