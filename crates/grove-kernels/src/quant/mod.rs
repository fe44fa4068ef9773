//! Quantized weights kept quantized: GGUF's Q8_0, Q5_0, Q5_1, Q4_0, Q4_1, Q2_K, Q3_K, Q4_K,
//! Q5_K, Q6_K, IQ4_NL, IQ4_XS and the 1- to 3-bit IQ (grid) formats' matrices multiplied
//! without dequantizing them to f32 first (the ternary TQ1_0 and TQ2_0 as Q2_K: `ternary.rs`).
//!
//! Decoding a small model on a CPU reads every weight once per step, so the step costs at least
//! (weight bytes) / (memory bandwidth); f32 copies of a Q5_0 model read 6x the bytes. Here each
//! activation row is quantized to 8 bits per 32 values (per 256 for the K-quants; as llama.cpp
//! does) and the product is integer dots (AVX-512 VNNI `vpdpbusd`), scaled in f32 per block. On
//! those CPUs every matrix lives in the column layout made at load ([`Layout`], `columns.rs`),
//! which one kernel reads for one activation row or many (`simd_columns.rs`).
//!
//! The reference (`scalar.rs`, also the fallback on other CPUs) describes every format the same
//! way: a row is a sequence of 64-weight *chunks*, and a chunk decodes to 64 unsigned integers
//! `u`, and per group of 4 weights (a "lane") a scale `s` and an offset `m`, with
//! `weight = s * u - m`; the dot with an activation chunk `x = dx * q` is
//! `sum_lanes(dx * (s * dot4(u, q) - m * sum4(q)))`.

#[cfg(target_arch = "x86_64")]
mod amx_columns;
#[cfg(target_arch = "x86_64")]
mod amx_kquants;
#[cfg(target_arch = "x86_64")]
pub(crate) mod amx_tiles;
#[cfg(target_arch = "x86_64")]
pub mod amx_trial;
mod arena;
#[cfg(target_arch = "x86_64")]
mod avx2_columns;
#[cfg(target_arch = "x86_64")]
mod avx2_kquants;
mod columns;
pub mod grids;
mod kernel;
mod products;
mod rows;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(target_arch = "x86_64")]
mod simd_blocks;
#[cfg(target_arch = "x86_64")]
mod simd_columns;
#[cfg(target_arch = "x86_64")]
mod simd_kquants;
pub mod ternary;

use std::borrow::Cow;
use std::sync::Arc;

pub use columns::FifthBits;
pub use kernel::Kernel;
pub use products::{matmul_gated, matmul_gated_with, matmul_many, matmul_many_with};
pub use rows::QuantizedRows;

use rayon::prelude::*;

use crate::threads::OutRows;

/// Weights per chunk (one 512-bit vector of bytes).
pub const CHUNK: usize = 64;
/// Weights per lane: `vpdpbusd` sums four byte products into one 32-bit lane.
pub const LANE: usize = 4;
/// Lanes per chunk.
pub const LANES: usize = CHUNK / LANE;

/// The GGUF block formats with a kernel here (ggml's type ids in [`QuantFormat::from_ggml`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantFormat {
    /// 32 weights: f16 scale, 32 x i8.
    Q8_0,
    /// 32 weights: f16 scale, 32 high bits, 32 x 4 low bits; `w = d * (q - 16)`.
    Q5_0,
    /// 32 weights: f16 scale and min, 32 high bits, 32 x 4 low bits; `w = d * q + m` (where
    /// a Q5_K_M file's rows are not whole super-blocks, llama.cpp writes these).
    Q5_1,
    /// 32 weights: f16 scale, 32 x 4 bits; `w = d * (q - 8)` (Q4_0 files, such as Google's
    /// quantization-aware Gemma 3 releases).
    Q4_0,
    /// 32 weights: f16 scale and min, 32 x 4 bits; `w = d * q + m` (Q4_1 files).
    Q4_1,
    /// 256 weights: f16 scale and min, 8 x (6-bit scale, 6-bit min), 256 x 4 bits.
    Q4K,
    /// 256 weights: 256 x (4 low + 2 high bits), 16 x i8 scales, f16 scale; `w = d*s*(q - 32)`.
    Q6K,
    /// 256 weights: Q4_K's header, 256 fifth bits, 256 x 4 bits; `w = d * sc * q - dmin * m`
    /// with `q < 32` (most tensors of the popular Q5_K_M and Q5_K_S files).
    Q5K,
    /// 256 weights: 256 high bits, 256 x 2 low bits, 16 6-bit scales, f16 scale;
    /// `w = d * (sc - 32) * (q - 4)` with `q < 8` (most tensors of the Q3_K_S, Q3_K_M and
    /// Q3_K_L files, some of Q2_K's).
    Q3K,
    /// 256 weights: 16 x (4-bit scale, 4-bit min), 256 x 2 bits, f16 scale and min;
    /// `w = d * sc * q - dmin * m` with `q < 4` (most tensors of the Q2_K files).
    Q2K,
    /// 32 weights: f16 scale, 32 x 4-bit indices into [`IQ4_VALUES`]; `w = d * IQ4_VALUES[q]`
    /// (Q4_0's bytes, a non-uniform grid of values; most tensors of IQ4_NL files, and the
    /// IQ4_XS files' where rows are not whole super-blocks).
    Iq4Nl,
    /// 256 weights: f16 scale, 8 x 6-bit scales, 256 x 4-bit indices into [`IQ4_VALUES`];
    /// `w = d * (sc - 32) * IQ4_VALUES[q]` (most tensors of IQ4_XS files).
    Iq4Xs,
    /// 256 weights: f16 scale, 64 grid points of 4 magnitudes, per 32 weights four 7-bit sign
    /// indices and a 4-bit scale; `w = d * (2 s + 1) / 4 * m` (most tensors of IQ3_XXS files,
    /// the attention keys of IQ3_XS files; `grids/iq3.rs`).
    Iq3Xxs,
    /// 256 weights: f16 scale, 64 grid points of 4 magnitudes (9-bit indices), 256 signs, 8 x
    /// 4-bit scales; `w = d * (2 s + 1) * m` (most tensors of IQ3_S, IQ3_M and IQ3_XS files;
    /// `grids/iq3.rs`).
    Iq3S,
    /// 256 weights: f16 scale, 32 grid points of 8 magnitudes, per 32 weights four 7-bit sign
    /// indices and a 4-bit scale; `w = d * (2 s + 1) / 8 * m` (most tensors of IQ2_XXS files;
    /// `grids/iq2.rs`).
    Iq2Xxs,
    /// 256 weights: f16 scale, 32 grid points (9-bit indices) with 7-bit sign indices, 16 x
    /// 4-bit scales; `w = d * (2 s + 1) / 8 * m` (most tensors of IQ2_XS files, some of
    /// IQ2_XXS's and IQ1's).
    Iq2Xs,
    /// 256 weights: f16 scale, 32 grid points (10-bit indices), 256 signs, 16 x 4-bit scales;
    /// `w = d * (2 s + 1) / 8 * m` (most tensors of IQ2_S and IQ2_M files, the attention keys
    /// of some IQ3_XXS files).
    Iq2S,
    /// 256 weights: f16 scale, 32 grid points of -1, 0, 1 (11-bit indices), per 32 weights a
    /// 3-bit scale and a shift `delta` of an eighth; `w = d * (2 s + 1) * (g + delta)` (most
    /// tensors of IQ1_S files; `grids/iq1.rs`).
    Iq1S,
    /// 256 weights: IQ1_S's grid points, a shift per 8 weights, 16 x 3-bit scales, `d` in
    /// the scales' spare bits (most tensors of IQ1_M files).
    Iq1M,
}

/// The 16 values of IQ4_NL's and IQ4_XS's 4-bit indices (ggml's `kvalues_iq4nl`).
pub const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

impl QuantFormat {
    /// Every format kept quantized.
    pub const ALL: [Self; 19] = [
        Self::Q8_0,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q2K,
        Self::Q3K,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
        Self::Iq4Nl,
        Self::Iq4Xs,
        Self::Iq3Xxs,
        Self::Iq3S,
        Self::Iq2Xxs,
        Self::Iq2Xs,
        Self::Iq2S,
        Self::Iq1S,
        Self::Iq1M,
    ];

    /// The format of ggml type id `id`, if there is a kernel for it.
    pub fn from_ggml(id: u32) -> Option<Self> {
        match id {
            8 => Some(Self::Q8_0),
            6 => Some(Self::Q5_0),
            7 => Some(Self::Q5_1),
            2 => Some(Self::Q4_0),
            3 => Some(Self::Q4_1),
            12 => Some(Self::Q4K),
            14 => Some(Self::Q6K),
            13 => Some(Self::Q5K),
            11 => Some(Self::Q3K),
            10 => Some(Self::Q2K),
            20 => Some(Self::Iq4Nl),
            23 => Some(Self::Iq4Xs),
            18 => Some(Self::Iq3Xxs),
            21 => Some(Self::Iq3S),
            16 => Some(Self::Iq2Xxs),
            17 => Some(Self::Iq2Xs),
            22 => Some(Self::Iq2S),
            19 => Some(Self::Iq1S),
            29 => Some(Self::Iq1M),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Q8_0 => "Q8_0",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q4K => "Q4_K",
            Self::Q6K => "Q6_K",
            Self::Q5K => "Q5_K",
            Self::Q3K => "Q3_K",
            Self::Q2K => "Q2_K",
            Self::Iq4Nl => "IQ4_NL",
            Self::Iq4Xs => "IQ4_XS",
            Self::Iq3Xxs => "IQ3_XXS",
            Self::Iq3S => "IQ3_S",
            Self::Iq2Xxs => "IQ2_XXS",
            Self::Iq2Xs => "IQ2_XS",
            Self::Iq2S => "IQ2_S",
            Self::Iq1S => "IQ1_S",
            Self::Iq1M => "IQ1_M",
        }
    }

    /// Weights per block.
    pub const fn block_weights(self) -> usize {
        match self {
            Self::Q8_0 | Self::Q5_0 | Self::Q5_1 | Self::Q4_0 | Self::Q4_1 | Self::Iq4Nl => 32,
            Self::Q2K
            | Self::Q3K
            | Self::Q4K
            | Self::Q5K
            | Self::Q6K
            | Self::Iq4Xs
            | Self::Iq3Xxs
            | Self::Iq3S
            | Self::Iq2Xxs
            | Self::Iq2Xs
            | Self::Iq2S
            | Self::Iq1S
            | Self::Iq1M => 256,
        }
    }

    /// Activation values sharing one scale when multiplied with this format.
    pub fn activation_block(self) -> usize {
        self.block_weights()
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q8_0 => 34,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q4K => 144,
            Self::Q6K => 210,
            Self::Q5K => 176,
            Self::Q3K => 110,
            Self::Q2K => 84,
            Self::Iq4Nl => 18,
            Self::Iq4Xs => 136,
            Self::Iq3Xxs => 98,
            Self::Iq3S => 110,
            Self::Iq2Xxs => 66,
            Self::Iq2Xs => 74,
            Self::Iq2S => 82,
            Self::Iq1S => 50,
            Self::Iq1M => 56,
        }
    }

    /// Whether the AMX kernel multiplies this format; the others go to the AVX-512 VNNI
    /// kernel on an AMX CPU (see [`Kernel::for_format`]).
    pub fn has_amx_kernel(self) -> bool {
        matches!(self, Self::Q8_0 | Self::Q5_0 | Self::Q4K | Self::Q6K)
    }

    /// The 16 values of a format whose weights are indices into them (IQ4_NL, IQ4_XS and the
    /// grid formats).
    pub const fn codebook(self) -> Option<&'static grids::Codebook> {
        match self {
            Self::Iq4Nl | Self::Iq4Xs => Some(&grids::IQ4),
            Self::Iq3Xxs => Some(&grids::IQ3_XXS),
            Self::Iq3S => Some(&grids::IQ3_S),
            Self::Iq2Xxs | Self::Iq2Xs | Self::Iq2S => Some(&grids::IQ2),
            Self::Iq1S | Self::Iq1M => Some(&grids::IQ1),
            _ => None,
        }
    }

    /// Whether a grid format scales each 16 weights (IQ2_XS, IQ2_S, IQ1_M), not each 32.
    pub const fn scales_16(self) -> bool {
        matches!(self, Self::Iq2Xs | Self::Iq2S | Self::Iq1M)
    }

    /// Whether a grid format's weights take at most 8 values (IQ2's and IQ1's 6), so that the
    /// column layout keeps a 3-bit index a weight, as Q3_K's weights (`columns.rs`).
    pub const fn three_bit_indices(self) -> bool {
        matches!(
            self,
            Self::Iq2Xxs | Self::Iq2Xs | Self::Iq2S | Self::Iq1S | Self::Iq1M
        )
    }

    /// Whether this is a grid format (`grids.rs`).
    pub const fn is_grid(self) -> bool {
        matches!(
            self,
            Self::Iq3Xxs
                | Self::Iq3S
                | Self::Iq2Xxs
                | Self::Iq2Xs
                | Self::Iq2S
                | Self::Iq1S
                | Self::Iq1M
        )
    }

    /// Bytes of one row of `k` weights, or `None` when `k` is not a whole number of chunks
    /// and blocks (such rows are not handled by the kernels).
    pub fn row_bytes(self, k: usize) -> Option<usize> {
        let whole = k > 0 && k.is_multiple_of(CHUNK) && k.is_multiple_of(self.block_weights());
        whole.then(|| k / self.block_weights() * self.block_bytes())
    }
}

/// Bytes that live in a memory-mapped file, in an owned buffer, or in the huge pages the
/// kernels' copies are made in.
#[derive(Clone)]
pub enum Bytes {
    /// A range of a mapped file.
    Mapped {
        map: Arc<memmap2::Mmap>,
        start: usize,
        len: usize,
    },
    Owned(Arc<Vec<u8>>),
    /// A matrix's copy in a kernel's layout (`arena.rs`).
    Copy {
        chunk: Arc<arena::Chunk>,
        start: usize,
        len: usize,
    },
}

impl Bytes {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Self::Mapped { map, start, len } => &map[*start..*start + *len],
            Self::Owned(bytes) => bytes,
            // SAFETY: the range came from `arena::allocate` and was written before it became
            // these bytes (`copied`); nothing writes it since.
            #[allow(unsafe_code)]
            Self::Copy { chunk, start, len } => unsafe { chunk.bytes(*start, *len) },
        }
    }

    /// Tells the kernel this process is done with `range` of a mapped file for now: its whole
    /// pages leave the resident set (they stay in the page cache, and come back if read
    /// again). A matrix copied into another layout at load releases its source this way, so
    /// the file and its copy are not both resident.
    fn release(&self, range: std::ops::Range<usize>) {
        #[cfg(unix)]
        self.release_pages(range);
        #[cfg(not(unix))]
        let _ = range;
    }

    /// [`Bytes::release`] of all these bytes: for a matrix copied out of a file in a form of
    /// the caller's (the dense strips).
    pub fn release_all(&self) {
        self.release(0..self.as_slice().len());
    }

    #[cfg(unix)]
    fn release_pages(&self, range: std::ops::Range<usize>) {
        const PAGE: usize = 4096;
        let Self::Mapped { map, start, .. } = self else {
            return;
        };
        let first = (start + range.start).next_multiple_of(PAGE);
        let end = (start + range.end) / PAGE * PAGE;
        if end > first {
            // SAFETY: `map` is a read-only file mapping: dropping its pages loses nothing
            // (a later read faults them in from the file again). An error only means the
            // pages stay resident (a page size other than 4 KiB), so it is ignored.
            #[allow(unsafe_code)]
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, end - first)
            };
        }
    }
}

/// How a matrix's blocks are arranged in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// GGUF's: row after row, block after block.
    Gguf,
    /// Strips of 16 rows, a vector holding the same four weights of each (`columns.rs`): what
    /// the AVX-512 and AVX2 kernels read every format in, Q5_0's fifth bits in the form its
    /// kernel reads (the AVX-512 and AMX kernels masks, AVX2 planes).
    Columns(FifthBits),
}

impl Layout {
    /// The layout `kernel` multiplies every format in.
    pub fn for_kernel(kernel: Kernel) -> Self {
        match kernel {
            Kernel::Amx | Kernel::Avx512Vnni => Self::Columns(FifthBits::Masks),
            Kernel::Avx2 => Self::Columns(FifthBits::Planes),
            Kernel::Scalar => Self::Gguf,
        }
    }
}

/// What a matrix is loaded for, which decides its layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixUse {
    /// Products (`matmul`): the layout of this CPU's kernel.
    Products,
    /// Row lookups only (an untied embedding): kept as the file has it, so only the rows
    /// looked up are ever resident.
    Lookups,
}

/// One weight row as a kernel reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WeightRow<'a> {
    Gguf(&'a [u8]),
    /// Row `p` of a strip of the column layout.
    Column {
        strip: &'a [u8],
        p: usize,
        q5_0: FifthBits,
    },
}

/// An `[n, k]` matrix in a block format, row-major like GGUF stores it.
#[derive(Clone)]
pub struct QMatrix {
    format: QuantFormat,
    n: usize,
    k: usize,
    row_bytes: usize,
    layout: Layout,
    bytes: Bytes,
}

impl std::fmt::Debug for QMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QMatrix({} [{}, {}], {:?})",
            self.format.name(),
            self.n,
            self.k,
            self.layout
        )
    }
}

/// The AVX-512 kernel's activation rows go through it in blocks of this many (one kernel
/// tile), so a block's quantized activations stay in L1 while a task's weight rows pass over
/// them (it takes all the rows and goes through its blocks itself, to ask for the next task's
/// weights while the later blocks multiply; AVX2's blocks are [`AVX2_ROWS_PER_BLOCK`]). Blocks
/// of 64 rows streamed them from L2 for every weight row: Qwen2.5-Coder-1.5B's 64-row verify
/// took 1550 ms against 1318 with blocks of 8. Blocks of 16 and 64 under the AVX-512
/// kernel's strip-at-a-time passes were slower again on a Zen 5 (docs/benchmarks.md,
/// session 24).
pub(super) const ACT_ROWS_PER_BLOCK: usize = 8;
/// The AVX2 kernel's blocks: 16 rows, so a block is three passes of Q6_K's and Q8_0's 6-row
/// tiles (6, 6, 4) over one decode of each half strip rather than two blocks of a 6-row and
/// a 2-row pass (docs/benchmarks.md, session 28).
const AVX2_ROWS_PER_BLOCK: usize = 16;
/// Weight rows per parallel task.
const WEIGHT_ROWS_PER_TASK: usize = 32;
/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 18;
/// Source bytes copied between two releases of the source pages: bounds how much of a
/// mapped file is resident beside its copy while a large matrix is being copied.
const COPY_SLAB: usize = 8 << 20;

impl QMatrix {
    /// The `[n, k]` matrix whose GGUF blocks are `bytes` (checks the length), in the layout
    /// of this CPU's kernel: on AVX-512 every format is copied into the column layout, and
    /// mapped source pages are released as they are copied.
    pub fn new(format: QuantFormat, n: usize, k: usize, bytes: Bytes) -> Result<Self, String> {
        Self::for_use(format, n, k, bytes, MatrixUse::Products)
    }

    /// [`QMatrix::new`] for `purpose`.
    pub fn for_use(
        format: QuantFormat,
        n: usize,
        k: usize,
        bytes: Bytes,
        purpose: MatrixUse,
    ) -> Result<Self, String> {
        let layout = match purpose {
            MatrixUse::Products => Layout::for_kernel(Kernel::detect()),
            MatrixUse::Lookups => Layout::Gguf,
        };
        Self::with_layout(format, n, k, bytes, layout)
    }

    /// [`QMatrix::new`] in a chosen layout (tests use both on any CPU).
    pub fn with_layout(
        format: QuantFormat,
        n: usize,
        k: usize,
        bytes: Bytes,
        layout: Layout,
    ) -> Result<Self, String> {
        let row_bytes = format.row_bytes(k).ok_or_else(|| {
            format!(
                "{} rows of {k} weights are not a whole number of {CHUNK}-weight chunks",
                format.name()
            )
        })?;
        let len = bytes.as_slice().len();
        if len != n * row_bytes {
            return Err(format!(
                "{} [{n}, {k}] needs {} bytes, got {len}",
                format.name(),
                n * row_bytes
            ));
        }
        let layout = if n == 0 { Layout::Gguf } else { layout };
        let bytes = match layout {
            Layout::Gguf => bytes,
            Layout::Columns(q5_0) => {
                let source_bytes = columns::STRIP * row_bytes;
                let strip_bytes = columns::strip_bytes(format, k);
                let strips = columns::strips(n);
                copied(&bytes, source_bytes, strip_bytes, strips, |src, s, out| {
                    columns::write_strip(format, q5_0, n, k, src, s, out)
                })?
            }
        };
        Ok(Self {
            format,
            n,
            k,
            row_bytes,
            layout,
            bytes,
        })
    }

    /// `values` (`[n, k]` f32, `k` a multiple of the chunk) rounded to Q8_0 as GGUF writes it:
    /// per 32 weights an f16 scale `max|x| / 127` and 32 signed bytes, in this CPU's layout.
    pub fn quantize_q8_0(values: &[f32], n: usize, k: usize) -> Result<Self, String> {
        if values.len() != n * k {
            return Err(format!("{} values for a [{n}, {k}] matrix", values.len()));
        }
        let mut bytes = Vec::with_capacity(values.len() / 32 * 34);
        for block in values.chunks_exact(32) {
            let amax = block.iter().fold(0f32, |m, &x| m.max(x.abs()));
            let inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            bytes.extend_from_slice(&half::f16::from_f32(amax / 127.0).to_bits().to_le_bytes());
            bytes.extend(
                block
                    .iter()
                    .map(|&x| (x * inverse).round().clamp(-127.0, 127.0) as i8 as u8),
            );
        }
        Self::new(QuantFormat::Q8_0, n, k, Bytes::Owned(Arc::new(bytes)))
    }

    /// A matrix of random blocks (random bytes with finite f16 scales), for tests and
    /// benchmarks.
    pub fn random(format: QuantFormat, n: usize, k: usize, seed: u64) -> Self {
        Self::random_in(format, n, k, seed, Layout::for_kernel(Kernel::detect()))
    }

    /// [`QMatrix::random`] in `layout`: in GGUF's, the random blocks as they were made (not
    /// through another layout and back, which a wrong decoder would get wrong alike both
    /// ways).
    pub(crate) fn random_in(
        format: QuantFormat,
        n: usize,
        k: usize,
        seed: u64,
        layout: Layout,
    ) -> Self {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let blocks = n * k / format.block_weights();
        let size = format.block_bytes();
        let mut bytes: Vec<u8> = (0..blocks * size).map(|_| rng.random()).collect();
        let scale_fields: &[usize] = match format {
            QuantFormat::Q8_0
            | QuantFormat::Q5_0
            | QuantFormat::Q4_0
            | QuantFormat::Iq4Nl
            | QuantFormat::Iq4Xs
            | QuantFormat::Iq3Xxs
            | QuantFormat::Iq3S
            | QuantFormat::Iq2Xxs
            | QuantFormat::Iq2Xs
            | QuantFormat::Iq2S
            | QuantFormat::Iq1S => &[0],
            // `d` in the top nibbles of its 4 words of scales (`grids/iq1.rs`).
            QuantFormat::Iq1M => &[],
            QuantFormat::Q5_1 | QuantFormat::Q4_1 | QuantFormat::Q4K | QuantFormat::Q5K => &[0, 2],
            QuantFormat::Q6K => &[208],
            QuantFormat::Q3K => &[108],
            QuantFormat::Q2K => &[80, 82],
        };
        for block in bytes.chunks_exact_mut(size) {
            for &at in scale_fields {
                // The software conversion (the same bits): Miri runs no F16C `vcvtps2ph`.
                let value = half::f16::from_f32_const(rng.random_range(-0.05f32..0.05));
                block[at..at + 2].copy_from_slice(&value.to_bits().to_le_bytes());
            }
            if format == QuantFormat::Iq1M {
                let d = half::f16::from_f32_const(rng.random_range(-0.05f32..0.05)).to_bits();
                for (k, word) in block[48..56].chunks_exact_mut(2).enumerate() {
                    let bits = u16::from_le_bytes([word[0], word[1]]) & 0x0FFF;
                    let bits = bits | ((d >> (4 * k)) & 0x0F) << 12;
                    word.copy_from_slice(&bits.to_le_bytes());
                }
            }
        }
        Self::with_layout(format, n, k, Bytes::Owned(Arc::new(bytes)), layout)
            .expect("whole chunks")
    }

    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// `(n, k)`: output rows, inputs per row.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The kernel that multiplies this matrix when `kernel` is asked for: the one
    /// [`Kernel::for_format`] names where the matrix is in `kernel`'s layout; otherwise (a
    /// lookup table multiplied anyway, a test's matrix in another kernel's layout) the
    /// reference.
    pub fn runs_on(&self, kernel: Kernel) -> Kernel {
        if self.layout == Layout::for_kernel(kernel) {
            kernel.for_format(self.format)
        } else {
            Kernel::Scalar
        }
    }

    /// Row `j` as the kernels read it.
    fn row(&self, j: usize) -> WeightRow<'_> {
        let contiguous = || &self.bytes.as_slice()[j * self.row_bytes..(j + 1) * self.row_bytes];
        match self.layout {
            Layout::Gguf => WeightRow::Gguf(contiguous()),
            Layout::Columns(q5_0) => WeightRow::Column {
                strip: self.strips(j / columns::STRIP, 1),
                p: j % columns::STRIP,
                q5_0,
            },
        }
    }

    /// Strips `first..first + count` of the column layout.
    fn strips(&self, first: usize, count: usize) -> &[u8] {
        let size = columns::strip_bytes(self.format, self.k);
        &self.bytes.as_slice()[first * size..(first + count) * size]
    }

    /// Row `j`'s blocks as GGUF stores them.
    fn gguf_row(&self, j: usize) -> Cow<'_, [u8]> {
        gguf_bytes(self.format, self.k, self.row(j))
    }

    /// Rows `ids` of this matrix as a matrix of their own, in its format and this CPU's
    /// layout: their weights exactly, in the bytes the format takes.
    pub fn gather_rows(&self, ids: &[u32]) -> Result<Self, String> {
        let mut bytes = Vec::with_capacity(ids.len() * self.row_bytes);
        for &id in ids {
            if id as usize >= self.n {
                return Err(format!("row {id} out of range for {} rows", self.n));
            }
            bytes.extend_from_slice(&self.gguf_row(id as usize));
        }
        Self::new(
            self.format,
            ids.len(),
            self.k,
            Bytes::Owned(Arc::new(bytes)),
        )
    }

    /// Weight row `j` as f32 into `out` (`k` values).
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        scalar::dequantize_row(self.format, &self.gguf_row(j), out);
    }

    /// The blocks as GGUF stores them, whatever the layout.
    pub fn to_bytes(&self) -> Vec<u8> {
        (0..self.n)
            .flat_map(|j| self.gguf_row(j).into_owned())
            .collect()
    }

    /// The whole matrix as f32, `[n, k]` row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.n * self.k];
        for (j, row) in out.chunks_exact_mut(self.k).enumerate() {
            self.dequantize_row(j, row);
        }
        out
    }

    /// `x W^T` as `[rows, n]` for `x: [rows, k]`, on the fastest kernel this CPU has.
    pub fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        self.matmul_with(Kernel::detect(), x, rows)
    }

    /// `x W^T` on a chosen kernel (tests compare them).
    pub fn matmul_with(&self, kernel: Kernel, x: &[f32], rows: usize) -> Vec<f32> {
        let mut outputs = matmul_many_with(kernel, &[self], x, rows);
        outputs.pop().expect("one matrix, one output")
    }

    /// Weight rows `first..first + w` (`w = out.width()`) dotted with every activation row,
    /// into `out`'s rows.
    fn task(&self, kernel: Kernel, acts: &QuantizedRows, first: usize, mut out: OutRows<'_>) {
        let (rows, w) = (out.rows(), out.width());
        let kernel = self.runs_on(kernel);
        #[cfg(target_arch = "x86_64")]
        if kernel != Kernel::Scalar && matches!(self.layout, Layout::Columns(_)) {
            debug_assert!(first.is_multiple_of(columns::STRIP));
            let strips = self.strips(first / columns::STRIP, columns::strips(w));
            if kernel == Kernel::Amx
                && amx_trial::tiles_from(self.format).is_some_and(|r| rows >= r)
            {
                // Tiles of 16 rows: the tile holds a block's activations, L1 need not.
                amx_columns::dot_strips(self.format, strips, w, acts, 0, out);
                return;
            }
            if kernel != Kernel::Avx2 {
                // Where the tiles multiply this format's many-row products, its few-row ones
                // round as theirs.
                let exact = kernel == Kernel::Amx && amx_trial::tiles_from(self.format).is_some();
                simd_columns::dot_strips(self.format, strips, w, acts, 0, out, exact);
                return;
            }
            // AVX2 reads Q5_0's fifth bits only as planes (no kernel hands it a matrix).
            debug_assert!(
                self.format != QuantFormat::Q5_0
                    || self.layout == Layout::Columns(FifthBits::Planes)
            );
            for block_start in (0..rows).step_by(AVX2_ROWS_PER_BLOCK) {
                let block_rows = AVX2_ROWS_PER_BLOCK.min(rows - block_start);
                let block = out.part(block_start, block_rows);
                avx2_columns::dot_strips(self.format, strips, w, acts, block_start, block);
            }
            return;
        }
        for offset in 0..w {
            let row = gguf_bytes(self.format, self.k, self.row(first + offset));
            for r in 0..rows {
                out.row(r)[offset].write(scalar::dot(self.format, &row, acts, r));
            }
        }
    }
}

/// The wrapping sum of `words`, read the way the kernels read weights (with the same software
/// prefetch where the SIMD kernels run): a memory read test whose speed decoding can reach.
pub fn streaming_sum(words: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if Kernel::detect() != Kernel::Scalar {
        return simd::streaming_sum(Kernel::detect(), words);
    }
    words.iter().fold(0, |a, &b| a.wrapping_add(b))
}

/// `row`'s blocks as GGUF stores them (a copy for the column layout).
fn gguf_bytes(format: QuantFormat, k: usize, row: WeightRow<'_>) -> Cow<'_, [u8]> {
    match row {
        WeightRow::Gguf(row) => Cow::Borrowed(row),
        WeightRow::Column { strip, p, q5_0 } => {
            let mut out = vec![0u8; format.row_bytes(k).expect("whole chunks")];
            columns::gguf_row(format, q5_0, strip, p, &mut out);
            Cow::Owned(out)
        }
    }
}

/// `source` copied into another layout, `units` pieces of `unit_bytes` each
/// (`fill(source, i, out)` writes piece `i`, in fresh zeroed memory), in huge pages where the
/// kernel gives them (`arena.rs`). Mapped source pages are released slab by slab, piece `i`
/// read from source bytes `i * source_bytes..(i + 1) * source_bytes` (the layouts keep a
/// piece's rows together).
fn copied(
    source: &Bytes,
    source_bytes: usize,
    unit_bytes: usize,
    units: usize,
    fill: impl Fn(&[u8], usize, &mut [u8]) + Sync,
) -> Result<Bytes, String> {
    let src = source.as_slice();
    let len = units * unit_bytes;
    let failed = |e: std::io::Error| format!("{len} bytes for the kernel's copy: {e}");
    let mut copy = arena::allocate(len).map_err(failed)?;
    let slab_units = (COPY_SLAB / source_bytes).max(1);
    for (slab, out) in copy
        .bytes_mut()
        .chunks_mut(slab_units * unit_bytes)
        .enumerate()
    {
        let first = slab * slab_units;
        out.par_chunks_mut(unit_bytes)
            .enumerate()
            .for_each(|(i, out)| fill(src, first + i, out));
        let end = ((first + slab_units) * source_bytes).min(src.len());
        source.release(first * source_bytes..end);
    }
    let (chunk, start, len) = copy.into_parts();
    Ok(Bytes::Copy { chunk, start, len })
}

/// One chunk of weights decoded: `weight[i] = scale[i / 4] * u[i] - offset[i / 4]`.
#[derive(Debug, Clone, Copy)]
struct DecodedChunk {
    u: [u8; CHUNK],
    scale: [f32; LANES],
    offset: [f32; LANES],
}

#[cfg(all(test, target_arch = "x86_64"))]
mod amx_tests;
#[cfg(test)]
mod tests;
