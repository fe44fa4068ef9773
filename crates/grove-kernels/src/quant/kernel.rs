//! Which implementation runs the quantized products.

/// Which implementation runs the dot products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Portable Rust, any CPU.
    Scalar,
    /// AVX2 with FMA and F16C (`vpmaddubsw`).
    Avx2,
    /// AVX-512 F/BW with VNNI.
    Avx512Vnni,
    /// AMX-INT8 tiles for products of several rows (`amx_columns.rs`), AVX-512 VNNI for the
    /// rest.
    Amx,
}

impl Kernel {
    /// The fastest kernel allowed here (this CPU's, unless `GROVE_KERNEL` asks for less). The
    /// AMX kernel where the level allows it and tiles are in use: `GROVE_KERNEL=amx`, or a
    /// trial on this machine found them faster for some format (`amx_trial`).
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::allows(crate::cpu::Level::Amx) && super::amx_trial::tiles_in_use() {
            return Self::Amx;
        }
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::allows(crate::cpu::Level::Avx512) {
            return Self::Avx512Vnni;
        }
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::allows(crate::cpu::Level::Avx2) {
            return Self::Avx2;
        }
        Self::Scalar
    }

    /// Whether this CPU has the kernel's instructions (whatever `GROVE_KERNEL` asks for).
    pub fn runs_here(self) -> bool {
        let needs = match self {
            Self::Scalar => crate::cpu::Level::Scalar,
            Self::Avx2 => crate::cpu::Level::Avx2,
            Self::Avx512Vnni => crate::cpu::Level::Avx512,
            Self::Amx => crate::cpu::Level::Amx,
        };
        crate::cpu::Level::supported() >= needs
    }

    /// Every kernel this CPU runs, the reference first (tests compare them all).
    pub fn available() -> Vec<Self> {
        [Self::Scalar, Self::Avx2, Self::Avx512Vnni, Self::Amx]
            .into_iter()
            .filter(|kernel| kernel.runs_here())
            .collect()
    }

    /// The name reports print.
    pub fn name(self) -> &'static str {
        match self {
            Self::Scalar => "scalar",
            Self::Avx2 => "avx2",
            Self::Avx512Vnni => "avx512-vnni",
            Self::Amx => "amx-int8",
        }
    }

    /// The kernel that multiplies `format` when this one is asked for: formats without an
    /// AMX kernel ([`super::QuantFormat::has_amx_kernel`]) go to the AVX-512 VNNI one, which
    /// every AMX CPU runs; it reads the same layout and activations.
    pub fn for_format(self, format: super::QuantFormat) -> Self {
        match self {
            Self::Amx if !format.has_amx_kernel() => Self::Avx512Vnni,
            other => other,
        }
    }

    /// The formats this kernel hands to another ([`Kernel::for_format`]), by name: what
    /// reports add beside the kernel's name.
    pub fn handed_on(self) -> Vec<(&'static str, Self)> {
        super::QuantFormat::ALL
            .into_iter()
            .filter(|&format| self.for_format(format) != self)
            .map(|format| (format.name(), self.for_format(format)))
            .collect()
    }

    /// Where this kernel adds Q6_K's zero point on this CPU, as reports name it: the AVX-512
    /// VNNI kernel's choice (`simd_columns::Q6Zero`); none for the other kernels (the AMX
    /// kernel's few-row products round as its tiles wherever the trial gives them Q6_K).
    pub fn q6k_zero_point(self) -> Option<&'static str> {
        #[cfg(target_arch = "x86_64")]
        if self == Self::Avx512Vnni {
            return Some(super::simd_columns::Q6Zero::here().name());
        }
        None
    }

    /// The kernel whose quantized activations this one reads (the AMX kernel reads the VNNI
    /// kernel's, and hands it products of few rows).
    pub fn activations(self) -> Self {
        match self {
            Self::Amx => Self::Avx512Vnni,
            other => other,
        }
    }
}
