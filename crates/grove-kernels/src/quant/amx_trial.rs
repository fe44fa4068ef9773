//! Where the AMX kernel multiplies: decided on the machine itself, by trial.
//!
//! Tiles pay only once their products outrun the AVX-512 VNNI kernel's, and how many
//! activation rows that takes depends on the CPU (its tile unit, its vector ports, whether
//! two vCPUs share a core, its memory), so no constant here could say. [`run`] multiplies a
//! matrix of each format on both kernels, checks that the tiles give the VNNI kernel's bits
//! (a row's outputs must not depend on the kernel: plain decoding's one row goes through
//! VNNI, a verify's tree rows through the tiles), times both at 4, 8, 9, 12 and 16 rows with the
//! weights read from memory, as a verify reads them, and gives each format the fewest rows
//! from which the tiles are faster ([`tiles_from`]). A program
//! [`adopt`]s the outcome; the `grove` binary runs the trial in a child process, so a CPU
//! whose tiles fault costs the tiles, not the program.
//!
//! Without an adopted trial the products use tiles only when `GROVE_KERNEL=amx` forces the
//! level, or a test names the AMX kernel (from [`MIN_ROWS`] rows).

use std::sync::OnceLock;
use std::time::Instant;

use super::amx_columns;
pub use super::amx_columns::MIN_ROWS;
use super::columns;
use super::{simd_columns, Kernel, Layout, QMatrix, QuantFormat, QuantizedRows};
use crate::threads::OutRows;

/// The row counts the trial times.
pub const TRIED_ROWS: [usize; 5] = [4, 8, 9, 12, 16];

/// The tiles must take at most this share of the VNNI kernel's time to be chosen: a margin
/// for the noise of a shared machine.
pub const WINS_BELOW: f64 = 0.9;

/// One format's trial: per row count of [`TRIED_ROWS`], the best time of each kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct FormatTrial {
    pub format: QuantFormat,
    /// (rows, tiles' seconds, VNNI kernel's seconds) per product.
    pub times: Vec<(usize, f64, f64)>,
}

impl FormatTrial {
    /// The fewest rows from which the tiles are faster by [`WINS_BELOW`] at every row count
    /// tried from there on; `None` where they are not faster at 16.
    pub fn tiles_from(&self) -> Option<usize> {
        let mut from = None;
        for &(rows, tiles, vnni) in self.times.iter().rev() {
            if tiles > WINS_BELOW * vnni {
                break;
            }
            from = Some(rows);
        }
        from
    }
}

/// A trial's outcome on this CPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    /// Whether the tiles gave the VNNI kernel's bits for every format (else they are not
    /// used at all).
    pub agrees: bool,
    pub formats: Vec<FormatTrial>,
}

/// Per format with an AMX kernel, the fewest rows it takes the tiles from (`None`: never).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan(pub Vec<(QuantFormat, Option<usize>)>);

impl Plan {
    /// No tiles for any format.
    pub fn none() -> Self {
        Self(Vec::new())
    }

    /// What a trial decided: nothing where the bits disagreed.
    pub fn from_trial(trial: &Trial) -> Self {
        if !trial.agrees {
            return Self::none();
        }
        Self(
            (trial.formats.iter())
                .map(|t| (t.format, t.tiles_from()))
                .collect(),
        )
    }

    fn tiles_from(&self, format: QuantFormat) -> Option<usize> {
        (self.0.iter())
            .find(|(f, _)| *f == format)
            .and_then(|(_, rows)| *rows)
    }
}

static ADOPTED: OnceLock<Plan> = OnceLock::new();

/// Makes `plan` this process's (once: a second plan is refused, returned as the error).
pub fn adopt(plan: Plan) -> Result<(), Plan> {
    ADOPTED.set(plan)
}

/// The adopted plan, if any.
pub fn adopted() -> Option<&'static Plan> {
    ADOPTED.get()
}

/// Whether products take tiles at all here: where `GROVE_KERNEL=amx` forces the level, or
/// the adopted plan gives some format tiles.
pub fn tiles_in_use() -> bool {
    match adopted() {
        Some(plan) => plan.0.iter().any(|(_, rows)| rows.is_some()),
        None => crate::cpu::forced(),
    }
}

/// The fewest activation rows from which the AMX kernel, once chosen ([`Kernel::detect`], or
/// by name where tests compare kernels), multiplies `format` on tiles: the adopted plan's,
/// else [`MIN_ROWS`].
pub fn tiles_from(format: QuantFormat) -> Option<usize> {
    if !format.has_amx_kernel() {
        return None;
    }
    match adopted() {
        Some(plan) => plan.tiles_from(format),
        None => Some(MIN_ROWS),
    }
}

/// Runs the trial (0.4 s on a Xeon family 6 model 207 with AMX); an error where this CPU has
/// no tiles (or Linux refused them).
pub fn run() -> Result<Trial, String> {
    if !Kernel::Amx.runs_here() {
        return Err("this CPU (or its kernel) gives no AMX tiles".into());
    }
    // 8.4 M weights: 4.7 (Q4_K) to 8.9 MB (Q8_0), read from memory for each timed product.
    let (n, k) = (2048, 4096);
    let mut agrees = true;
    let mut formats = Vec::new();
    for format in QuantFormat::ALL.into_iter().filter(|f| f.has_amx_kernel()) {
        let bytes = QMatrix::random(format, n, k, 7).to_bytes();
        let layout = Layout::for_kernel(Kernel::Amx);
        let matrix = QMatrix::with_layout(format, n, k, super::Bytes::Owned(bytes.into()), layout)?;
        // A tile of 16 rows and one of 3 (the rest), against the VNNI kernel.
        let rows = 19;
        let x: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 7919 + 13) % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        let acts = QuantizedRows::for_kernel(Kernel::Avx512Vnni, &x, rows, k, &[format]);
        let bits = |tiles: bool, rows: usize| {
            let mut out = vec![0f32; rows * n];
            product(&matrix, &acts, tiles, OutRows::block(&mut out, rows));
            out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        agrees &= bits(true, rows) == bits(false, rows);
        let times = TRIED_ROWS
            .iter()
            .map(|&rows| {
                let (tiles, vnni) = best_times(&matrix, &acts, rows);
                (rows, tiles, vnni)
            })
            .collect();
        formats.push(FormatTrial { format, times });
    }
    Ok(Trial { agrees, formats })
}

/// `matrix` against `acts`' first rows (as many as `out` lends) on the tiles or the VNNI
/// kernel, on this thread.
fn product(matrix: &QMatrix, acts: &QuantizedRows, tiles: bool, out: OutRows<'_>) {
    let n = matrix.n;
    let strips = matrix.strips(0, columns::strips(n));
    if tiles {
        amx_columns::dot_strips(matrix.format, strips, n, acts, 0, out);
    } else {
        // With the tiles' rounding: their bits are compared.
        simd_columns::dot_strips(matrix.format, strips, n, acts, 0, out, true);
    }
}

/// The best of five timings of each kernel's product of `rows` rows, alternating, each with
/// the weights read from memory ([`from_memory`]): as a verify reads them, where both
/// kernels' requests for the weights ahead count.
fn best_times(matrix: &QMatrix, acts: &QuantizedRows, rows: usize) -> (f64, f64) {
    let mut out = vec![0f32; rows * matrix.n];
    let weights = matrix.strips(0, columns::strips(matrix.n));
    let mut time = |tiles: bool| {
        from_memory(weights, &mut || {
            product(matrix, acts, tiles, OutRows::block(&mut out, rows));
        })
    };
    let (mut tiles, mut vnni) = (f64::MAX, f64::MAX);
    for _ in 0..5 {
        tiles = tiles.min(time(true));
        vnni = vnni.min(time(false));
    }
    (tiles, vnni)
}

/// The seconds `product` takes with `bytes` (its weights) read from memory, as a verify
/// reads them: every line of `bytes` evicted from every cache level first.
pub(super) fn from_memory(bytes: &[u8], product: &mut impl FnMut()) -> f64 {
    evict(bytes);
    let start = Instant::now();
    product();
    start.elapsed().as_secs_f64()
}

/// Every line of `bytes` out of every cache level. With `clflushopt` where the CPU has it
/// (every AMX CPU does): `clflush`es are ordered among themselves, and on an AMX CPU the
/// trial's 120 evictions of up to 8.9 MB took most of its 1.7 s with them.
fn evict(bytes: &[u8]) {
    use std::arch::x86_64::{__cpuid_count, _mm_clflush, _mm_mfence};
    static OPT: OnceLock<bool> = OnceLock::new();
    // `cpuid` leaf 7's EBX bit 23 is CLFLUSHOPT.
    let opt = *OPT.get_or_init(|| __cpuid_count(7, 0).ebx & (1 << 23) != 0);
    for line in bytes.chunks(64) {
        // SAFETY: `clflushopt` where CPUID says the CPU has it, else `clflush` (SSE2, every
        // x86-64), of a line inside a live slice.
        #[allow(unsafe_code)]
        unsafe {
            if opt {
                std::arch::asm!(
                    "clflushopt [{}]",
                    in(reg) line.as_ptr(),
                    options(nostack, preserves_flags)
                );
            } else {
                _mm_clflush(line.as_ptr());
            }
        }
    }
    // SAFETY: SSE2; orders the evictions (`clflushopt`'s too) before the product's loads.
    #[allow(unsafe_code)]
    unsafe {
        _mm_mfence()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial(times: &[(usize, f64, f64)]) -> FormatTrial {
        FormatTrial {
            format: QuantFormat::Q8_0,
            times: times.to_vec(),
        }
    }

    #[test]
    fn tiles_are_chosen_from_the_rows_where_they_stay_faster() {
        let faster_from_8 = trial(&[(4, 1.0, 1.0), (8, 1.5, 2.0), (16, 2.0, 4.0)]);
        assert_eq!(faster_from_8.tiles_from(), Some(8));
        let always = trial(&[(4, 0.5, 1.0), (8, 1.0, 2.0), (16, 2.0, 4.0)]);
        assert_eq!(always.tiles_from(), Some(4));
        let never = trial(&[(4, 0.5, 1.0), (8, 1.0, 2.0), (16, 3.9, 4.0)]);
        assert_eq!(never.tiles_from(), None, "not faster by the margin at 16");
        // Faster at 4 and 16 but not at 8: from 16 only.
        let gap = trial(&[(4, 0.5, 1.0), (8, 2.0, 2.0), (16, 2.0, 4.0)]);
        assert_eq!(gap.tiles_from(), Some(16));
    }

    #[test]
    fn a_plan_uses_no_tiles_where_the_bits_disagreed() {
        let formats = vec![trial(&[(4, 0.5, 1.0), (8, 1.0, 2.0), (16, 2.0, 4.0)])];
        let agreeing = Trial {
            agrees: true,
            formats: formats.clone(),
        };
        let plan = Plan::from_trial(&agreeing);
        assert_eq!(plan.tiles_from(QuantFormat::Q8_0), Some(4));
        assert_eq!(plan.tiles_from(QuantFormat::Q6K), None, "not tried");
        let disagreeing = Trial {
            agrees: false,
            formats,
        };
        assert_eq!(Plan::from_trial(&disagreeing), Plan::none());
    }

    /// Where the CPU has tiles, the trial runs them against the VNNI kernel: their bits must
    /// agree (this is the real tiles' check, beside the modelled tiles' tests). Elsewhere it
    /// says why it cannot run (and fails where `GROVE_REQUIRE_AMX=1`).
    #[test]
    fn the_trial_finds_the_tiles_agree_with_the_vnni_kernel() {
        let present = Kernel::Amx.runs_here();
        if crate::skip_without("amx", present, "the_trial_finds_the_tiles_agree") {
            assert!(run().unwrap_err().contains("no AMX tiles"));
            return;
        }
        let trial = run().expect("a trial where the CPU has tiles");
        eprintln!("{trial:?}");
        assert!(
            trial.agrees,
            "the tiles' bits differ from the VNNI kernel's"
        );
        assert_eq!(trial.formats.len(), 4);
    }
}
