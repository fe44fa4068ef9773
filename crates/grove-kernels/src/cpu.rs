//! Which instruction sets the kernels use: the best this CPU has, or the one `GROVE_KERNEL`
//! names (to measure a path against another, or to test the portable one on any machine).
//!
//! Every SIMD path asks [`level`] (once per process it reads the CPU's features and the
//! variable), so forcing a level forces it everywhere: quantized and dense products,
//! attention, activations.

use std::sync::OnceLock;

/// The environment variable that forces a level.
pub const VARIABLE: &str = "GROVE_KERNEL";

/// A set of instructions the kernels may use, in order: each includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Portable Rust: the reference every SIMD path is tested against.
    Scalar,
    /// AVX2, FMA and F16C (every kernel but the gated activations: the quantized products
    /// in `vpmaddubsw`, dense strips, attention).
    Avx2,
    /// AVX-512 F/BW/DQ with VNNI, F16C and BMI2 (every kernel).
    Avx512,
    /// AVX-512 and AMX-INT8 tiles: quantized products of several activation rows on tiles
    /// where they pay (see [`Level::default_here`]), everything else as `Avx512`.
    Amx,
}

impl Level {
    /// The name `GROVE_KERNEL` takes and reports print.
    pub fn name(self) -> &'static str {
        match self {
            Self::Scalar => "scalar",
            Self::Avx2 => "avx2",
            Self::Avx512 => "avx512",
            Self::Amx => "amx",
        }
    }

    /// The best level this CPU runs.
    pub fn supported() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f")
                && has!("avx512bw")
                && has!("avx512dq")
                && has!("avx512vnni")
                && has!("f16c")
                && has!("bmi2")
                && has!("fma")
            {
                if crate::quant::amx_tiles::available() {
                    return Self::Amx;
                }
                return Self::Avx512;
            }
            if has!("avx2") && has!("fma") && has!("f16c") {
                return Self::Avx2;
            }
        }
        Self::Scalar
    }

    /// The level `value` names (as `GROVE_KERNEL` would), if this CPU and build run it.
    pub fn parse(value: &str) -> Result<Self, String> {
        let supported = Self::supported();
        let level = match value.trim().to_ascii_lowercase().as_str() {
            "scalar" => Self::Scalar,
            "avx2" => Self::Avx2,
            "avx512" => Self::Avx512,
            "amx" => Self::Amx,
            other => {
                return Err(format!(
                    "{VARIABLE}={other:?} is not a kernel level (scalar, avx2, avx512, amx)"
                ))
            }
        };
        if level > supported {
            return Err(format!(
                "{VARIABLE}={}: this CPU runs up to {}",
                level.name(),
                supported.name()
            ));
        }
        Ok(level)
    }

    /// The level kernels run at unless `GROVE_KERNEL` says otherwise: the best supported.
    /// At the AMX level the quantized products take tiles only where a trial on this machine
    /// found them faster (`quant::amx_trial`), or everywhere from a few rows where
    /// `GROVE_KERNEL=amx` forces the level.
    pub fn default_here() -> Self {
        Self::supported()
    }

    /// The level `GROVE_KERNEL` asks for, or [`Level::default_here`] where it is unset.
    pub fn from_env() -> Result<Self, String> {
        match std::env::var(VARIABLE) {
            Ok(value) if !value.trim().is_empty() => Self::parse(&value),
            _ => Ok(Self::default_here()),
        }
    }
}

/// The level every kernel runs at in this process ([`Level::from_env`], read once). Programs
/// check the variable first ([`Level::from_env`] at start-up) to report a bad value as an
/// error; here it can only be a panic.
pub fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| Level::from_env().unwrap_or_else(|e| panic!("{e}")))
}

/// Whether `GROVE_KERNEL` names the level (read once), rather than the CPU deciding.
pub fn forced() -> bool {
    static FORCED: OnceLock<bool> = OnceLock::new();
    *FORCED.get_or_init(|| std::env::var(VARIABLE).is_ok_and(|value| !value.trim().is_empty()))
}

/// Whether the kernels may use `wanted`'s instructions.
pub fn allows(wanted: Level) -> bool {
    level() >= wanted
}

/// Whether this CPU issues two 512-bit `vpdpbusd`s a cycle beside two vector loads: AMD's
/// Zen 5 (family 0x1A) and later; Zen 4 runs one a cycle as two 256-bit halves. There a
/// kernel whose every `vpdpbusd` broadcasts its activations from memory is held to its loads'
/// pace, so a load beside them costs more than an instruction on their ports (the `peak`
/// example measures both; docs/benchmarks.md, session 54). Intel's cores are not counted:
/// none measured here without AMX, whose tiles take the many-row products.
pub fn two_vnni_a_cycle() -> bool {
    amd_family().is_some_and(|family| family >= 0x1A)
}

/// Whether a product of a few activation rows (a decode step's, a small tree's: up to
/// `quant::simd::L1_ONLY_ROWS`) should ask for its weights into L1 only, not also further
/// ahead into L2: on AMD's Zen 5 (family 0x1A) the requests into L2 held such products from
/// memory below the pace of the same products without them (the `decode_stream` example;
/// docs/benchmarks.md, session 63), while tiles of 5 rows and more were slower without them.
/// On the Intel Xeon they raised a plain read from 14-24 to 24-29 GB/s
/// (`quant::simd::PREFETCH_L2`); other CPUs keep them, unmeasured.
pub fn few_rows_request_l1_only() -> bool {
    amd_family().is_some_and(|family| family >= 0x1A)
}

/// AMD's family number (base plus extended) where the CPU is AMD's; read once.
fn amd_family() -> Option<u32> {
    static FAMILY: OnceLock<Option<u32>> = OnceLock::new();
    *FAMILY.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        {
            use std::arch::x86_64::__cpuid;
            let (vendor, signature) = (__cpuid(0), __cpuid(1).eax);
            let amd =
                [vendor.ebx, vendor.edx, vendor.ecx] == [0x6874_7541, 0x6974_6E65, 0x444D_4163];
            let base = (signature >> 8) & 0xF;
            let family = base
                + if base == 0xF {
                    (signature >> 20) & 0xFF
                } else {
                    0
                };
            amd.then_some(family)
        }
        // Miri runs no `cpuid` (`scripts/miri_avx512.sh`): the kernels' other forms there;
        // both are held to the reference natively.
        #[cfg(any(not(target_arch = "x86_64"), miri))]
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_by_name_and_refuse_what_the_cpu_lacks() {
        assert_eq!(Level::parse("scalar"), Ok(Level::Scalar));
        assert_eq!(
            Level::parse(" AVX512 ").map(Level::name),
            match Level::supported() {
                Level::Avx512 | Level::Amx => Ok("avx512"),
                best => Err(format!(
                    "GROVE_KERNEL=avx512: this CPU runs up to {}",
                    best.name()
                )),
            }
        );
        match Level::supported() {
            Level::Amx => assert_eq!(Level::parse("amx"), Ok(Level::Amx)),
            best => assert_eq!(
                Level::parse("amx"),
                Err(format!(
                    "GROVE_KERNEL=amx: this CPU runs up to {}",
                    best.name()
                ))
            ),
        }
        assert_eq!(Level::default_here(), Level::supported());
        let unknown = Level::parse("sse9").unwrap_err();
        assert!(
            unknown.contains("\"sse9\" is not a kernel level"),
            "{unknown}"
        );
        assert!(
            Level::Scalar < Level::Avx2
                && Level::Avx2 < Level::Avx512
                && Level::Avx512 < Level::Amx
        );
    }
}
