//! AMX's tile registers, as the AMX-INT8 kernel (`amx_columns.rs`) uses them: the CPU's
//! (`Hardware`, a few instructions in inline assembly: Rust's AMX intrinsics are unstable)
//! and a model of them in plain Rust (`Emulated`), so that the kernel's arithmetic, layouts
//! and strides are tested on every machine, and against the real tiles where a CPU has them.
//!
//! What the kernel relies on (Intel's Architecture Instruction Set Extensions reference,
//! "Intel AMX"): eight tiles of at most 16 rows of 64 bytes, shaped by a 64-byte
//! configuration (palette 1; bytes 16.. the tiles' bytes per row as u16, bytes 48.. their
//! rows); `tileloadd` reads a tile's rows from `base + row * stride`; `tdpbsud c, a, b` adds to
//! each 32-bit element `c[m][n]` the sum over `k` of four products of a signed byte
//! `a[m][4k + j]` and an unsigned byte `b[k][4n + j]`, wrapping; `tilestored` writes a tile's
//! rows; `tdpbssd` is `tdpbsud` with signed bytes in `b` too; rows and bytes past a tile's
//! shape read as zero.
//!
//! Linux hands a process the tiles' 8 KiB of state only once asked
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); [`available`] asks, once.
// SAFETY (all of the module): `Hardware`'s methods execute AMX instructions, so they are
// called only where `available()` returned true (`cpu::Level::Amx`); their pointers are the
// kernel's, inside the buffers it sized for the configured shapes.
#![allow(unsafe_code)]

use std::arch::asm;
use std::sync::OnceLock;

/// Rows of a tile.
pub const ROWS: usize = 16;
/// Bytes of a tile's row.
pub const ROW_BYTES: usize = 64;

/// A tile configuration: what `ldtilecfg` reads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(C, align(64))]
pub struct Config([u8; 64]);

impl Config {
    /// Palette 1, every tile unused.
    pub fn new() -> Self {
        let mut bytes = [0u8; 64];
        bytes[0] = 1;
        Self(bytes)
    }

    /// Tile `t` shaped as `rows` rows of `bytes` bytes.
    pub fn shape(mut self, t: usize, rows: usize, bytes: usize) -> Self {
        assert!(t < 8 && (1..=ROWS).contains(&rows) && (4..=ROW_BYTES).contains(&bytes));
        self.0[16 + 2 * t..18 + 2 * t].copy_from_slice(&(bytes as u16).to_le_bytes());
        self.0[48 + t] = rows as u8;
        self
    }

    #[cfg(test)]
    fn rows(&self, t: usize) -> usize {
        usize::from(self.0[48 + t])
    }

    #[cfg(test)]
    fn bytes(&self, t: usize) -> usize {
        usize::from(u16::from_le_bytes([self.0[16 + 2 * t], self.0[17 + 2 * t]]))
    }
}

impl Default for Config {
    fn default() -> Self {
        Self::new()
    }
}

/// The tile operations the kernel uses; tile numbers are const parameters because the
/// instructions name their tiles.
pub trait Tiles {
    /// `ldtilecfg`: shapes every tile (and zeroes them).
    unsafe fn configure(&mut self, config: &Config);
    /// `tilezero`.
    unsafe fn zero<const T: u8>(&mut self);
    /// `tileloadd`: tile `T`'s rows from `base + row * stride`.
    unsafe fn load<const T: u8>(&mut self, base: *const u8, stride: usize);
    /// `tdpbsud`: `C += A (signed bytes) . B (unsigned bytes)`.
    unsafe fn dot<const C: u8, const A: u8, const B: u8>(&mut self);
    /// `tdpbssd`: `C += A (signed bytes) . B (signed bytes)`.
    unsafe fn dot_signed<const C: u8, const A: u8, const B: u8>(&mut self);
    /// `tilestored`: tile `T`'s rows to `base + row * stride`.
    unsafe fn store<const T: u8>(&mut self, base: *mut u8, stride: usize);
    /// `tilerelease`: the tiles back to their initial (unused) state.
    unsafe fn release(&mut self);
}

/// This CPU's tiles.
pub struct Hardware;

impl Tiles for Hardware {
    #[inline(always)]
    unsafe fn configure(&mut self, config: &Config) {
        asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack, readonly));
    }

    #[inline(always)]
    unsafe fn zero<const T: u8>(&mut self) {
        asm!("tilezero tmm{t}", t = const T, options(nostack, nomem));
    }

    #[inline(always)]
    unsafe fn load<const T: u8>(&mut self, base: *const u8, stride: usize) {
        asm!(
            "tileloadd tmm{t}, [{base} + {stride} * 1]",
            t = const T,
            base = in(reg) base,
            stride = in(reg) stride,
            options(nostack, readonly)
        );
    }

    #[inline(always)]
    unsafe fn dot<const C: u8, const A: u8, const B: u8>(&mut self) {
        asm!(
            "tdpbsud tmm{c}, tmm{a}, tmm{b}",
            c = const C,
            a = const A,
            b = const B,
            options(nostack, nomem)
        );
    }

    #[inline(always)]
    unsafe fn dot_signed<const C: u8, const A: u8, const B: u8>(&mut self) {
        asm!(
            "tdpbssd tmm{c}, tmm{a}, tmm{b}",
            c = const C,
            a = const A,
            b = const B,
            options(nostack, nomem)
        );
    }

    #[inline(always)]
    unsafe fn store<const T: u8>(&mut self, base: *mut u8, stride: usize) {
        asm!(
            "tilestored [{base} + {stride} * 1], tmm{t}",
            t = const T,
            base = in(reg) base,
            stride = in(reg) stride,
            options(nostack)
        );
    }

    #[inline(always)]
    unsafe fn release(&mut self) {
        asm!("tilerelease", options(nostack, nomem));
    }
}

/// Tiles that do nothing: the kernel's work outside them, timed alone (the AMX kernel's
/// lanes measured on a CPU without tiles, `quant::amx_tests::amx_lanes_alone`).
#[cfg(test)]
pub struct Absent;

#[cfg(test)]
impl Tiles for Absent {
    unsafe fn configure(&mut self, _: &Config) {}
    unsafe fn zero<const T: u8>(&mut self) {}
    unsafe fn load<const T: u8>(&mut self, base: *const u8, _: usize) {
        std::hint::black_box(base);
    }
    unsafe fn dot<const C: u8, const A: u8, const B: u8>(&mut self) {}
    unsafe fn dot_signed<const C: u8, const A: u8, const B: u8>(&mut self) {}
    unsafe fn store<const T: u8>(&mut self, base: *mut u8, _: usize) {
        std::hint::black_box(base);
    }
    unsafe fn release(&mut self) {}
}

/// The tiles modelled in Rust, as the reference above describes them.
#[cfg(test)]
pub struct Emulated {
    config: Config,
    tiles: [[[u8; ROW_BYTES]; ROWS]; 8],
}

#[cfg(test)]
impl Emulated {
    pub fn new() -> Self {
        Self {
            config: Config::new(),
            tiles: [[[0; ROW_BYTES]; ROWS]; 8],
        }
    }

    fn element(&self, t: usize, row: usize, n: usize) -> i32 {
        let bytes = &self.tiles[t][row][4 * n..4 * n + 4];
        i32::from_le_bytes(bytes.try_into().expect("4 bytes"))
    }

    /// `tdpbsud` (or where `signed_b`, `tdpbssd`) of tiles `c`, `a` and `b`.
    fn product(&mut self, c: usize, a: usize, b: usize, signed_b: bool) {
        let (m_rows, n_cols) = (self.config.rows(c), self.config.bytes(c) / 4);
        let k_groups = self.config.bytes(a) / 4;
        assert_eq!(self.config.rows(a), m_rows, "A's rows are C's");
        assert_eq!(self.config.rows(b), k_groups, "B's rows are A's groups");
        assert_eq!(
            self.config.bytes(b),
            self.config.bytes(c),
            "B's width is C's"
        );
        for m in 0..m_rows {
            for n in 0..n_cols {
                let mut sum = self.element(c, m, n);
                for k in 0..k_groups {
                    for j in 0..4 {
                        let x = i32::from(self.tiles[a][m][4 * k + j] as i8);
                        let byte = self.tiles[b][k][4 * n + j];
                        let w = if signed_b {
                            i32::from(byte as i8)
                        } else {
                            i32::from(byte)
                        };
                        sum = sum.wrapping_add(x * w);
                    }
                }
                self.tiles[c][m][4 * n..4 * n + 4].copy_from_slice(&sum.to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
impl Default for Emulated {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
impl Tiles for Emulated {
    unsafe fn configure(&mut self, config: &Config) {
        self.config = *config;
        self.tiles = [[[0; ROW_BYTES]; ROWS]; 8];
    }

    unsafe fn zero<const T: u8>(&mut self) {
        self.tiles[usize::from(T)] = [[0; ROW_BYTES]; ROWS];
    }

    unsafe fn load<const T: u8>(&mut self, base: *const u8, stride: usize) {
        let t = usize::from(T);
        let (rows, bytes) = (self.config.rows(t), self.config.bytes(t));
        self.tiles[t] = [[0; ROW_BYTES]; ROWS];
        for (r, row) in self.tiles[t].iter_mut().take(rows).enumerate() {
            let source = std::slice::from_raw_parts(base.add(r * stride), bytes);
            row[..bytes].copy_from_slice(source);
        }
    }

    unsafe fn dot<const C: u8, const A: u8, const B: u8>(&mut self) {
        self.product(usize::from(C), usize::from(A), usize::from(B), false);
    }

    unsafe fn dot_signed<const C: u8, const A: u8, const B: u8>(&mut self) {
        self.product(usize::from(C), usize::from(A), usize::from(B), true);
    }

    unsafe fn store<const T: u8>(&mut self, base: *mut u8, stride: usize) {
        let t = usize::from(T);
        let (rows, bytes) = (self.config.rows(t), self.config.bytes(t));
        for (r, row) in self.tiles[t].iter().take(rows).enumerate() {
            std::ptr::copy_nonoverlapping(row.as_ptr(), base.add(r * stride), bytes);
        }
    }

    unsafe fn release(&mut self) {
        *self = Self::new();
    }
}

/// Whether this CPU has AMX-TILE and AMX-INT8 and Linux let this process use them (asked
/// once per process). Never under Miri, which runs no tile instruction (nor `cpuid`).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| !cfg!(miri) && cpu_has_amx() && request_tile_data())
}

/// CPUID leaf 7: EDX bit 24 is AMX-TILE, bit 25 AMX-INT8.
fn cpu_has_amx() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    let (max_leaf, leaf7) = (__cpuid(0).eax, __cpuid_count(7, 0));
    max_leaf >= 7 && leaf7.edx & (1 << 24) != 0 && leaf7.edx & (1 << 25) != 0
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: without it the first tile
/// instruction is a SIGILL (Linux 5.16 and later; older kernels refuse AMX altogether).
fn request_tile_data() -> bool {
    const SYS_ARCH_PRCTL: usize = 158;
    const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
    const XFEATURE_XTILEDATA: usize = 18;
    let result: isize;
    // SAFETY: a system call that only changes this process's permitted xsave features; it
    // clobbers rcx and r11 as every `syscall` does.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL as isize => result,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack)
        );
    }
    result == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model's `tdpbsud` against the definition, written out for one small case: a
    /// signed byte of A times an unsigned byte of B (255 is 255, -1 is -1); then its
    /// `tdpbssd`, where B's bytes are signed too.
    #[test]
    fn emulated_dot_products_take_signed_or_unsigned_weights() {
        let config = Config::new().shape(0, 2, 8).shape(1, 2, 8).shape(2, 2, 8);
        let mut tiles = Emulated::new();
        // A: 2 rows x 8 bytes (two groups of four); B: 2 rows (groups) x 2 columns of 4.
        let a: [i8; 16] = [1, -1, 2, 0, 3, 0, 0, -128, 0, 0, 0, 0, 1, 1, 1, 1];
        let b: [u8; 16] = [255, 1, 0, 0, 1, 2, 3, 4, 2, 0, 0, 1, 0, 0, 0, 0];
        let mut c = [7i32; 4];
        unsafe {
            tiles.configure(&config);
            tiles.load::<0>(c.as_ptr().cast(), 8);
            tiles.load::<1>(a.as_ptr().cast(), 8);
            tiles.load::<2>(b.as_ptr(), 8);
            tiles.dot::<0, 1, 2>();
            tiles.store::<0>(c.as_mut_ptr().cast(), 8);
        }
        let expected = |m: usize, n: usize| {
            (0..8).fold(7i32, |sum, i| {
                let (k, j) = (i / 4, i % 4);
                sum + i32::from(a[8 * m + i]) * i32::from(b[8 * k + 4 * n + j])
            })
        };
        assert_eq!(
            c,
            [
                expected(0, 0),
                expected(0, 1),
                expected(1, 0),
                expected(1, 1)
            ]
        );
        assert_eq!(c[0], 7 + 255 - 1 + 3 * 2 - 128);
        // `tdpbssd` on the same tiles: B's 255 is -1 now.
        unsafe {
            tiles.dot_signed::<0, 1, 2>();
            tiles.store::<0>(c.as_mut_ptr().cast(), 8);
        }
        assert_eq!(c[0], 7 + 2 * (255 - 1 + 3 * 2 - 128) - 256);
    }

    #[test]
    fn configurations_are_laid_out_as_ldtilecfg_reads_them() {
        let config = Config::new().shape(3, 16, 64).shape(5, 8, 32);
        assert_eq!(config.0[0], 1, "palette 1");
        assert_eq!(&config.0[22..24], &[64, 0]);
        assert_eq!(&config.0[26..28], &[32, 0]);
        assert_eq!((config.0[51], config.0[53]), (16, 8));
        assert_eq!((config.rows(5), config.bytes(5)), (8, 32));
    }
}
