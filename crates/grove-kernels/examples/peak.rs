//! The instruction peaks the kernels are measured against: 512-bit `vpdpbusd` (with its
//! activation bytes broadcast from memory, as `quant/simd_columns.rs` issues it) and 512-bit
//! `vfmadd231ps`, each over 12 independent sums (more than latency x throughput), on one core
//! and on every core at once. `cargo run --release -p grove-kernels --example peak`.

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn run(kind: &str, iterations: u64) -> f64 {
    use std::arch::asm;
    let memory = [1i32; 16];
    let start = std::time::Instant::now();
    // SAFETY: only called where the CPU has AVX-512 VNNI (checked in `main`); the loop reads
    // `memory`'s first 48 bytes and touches only the registers it names.
    unsafe {
        macro_rules! twelve {
            ($op:literal) => {
                asm!(
                    "vpxord zmm0, zmm0, zmm0", "vpxord zmm1, zmm1, zmm1", "vpxord zmm2, zmm2, zmm2",
                    "vpxord zmm3, zmm3, zmm3", "vpxord zmm4, zmm4, zmm4", "vpxord zmm5, zmm5, zmm5",
                    "vpxord zmm6, zmm6, zmm6", "vpxord zmm7, zmm7, zmm7", "vpxord zmm8, zmm8, zmm8",
                    "vpxord zmm9, zmm9, zmm9", "vpxord zmm10, zmm10, zmm10", "vpxord zmm11, zmm11, zmm11",
                    "vmovdqu32 zmm16, [{m}]",
                    "2:",
                    concat!($op, " zmm0, zmm16, dword ptr [{m}]{{1to16}}"),
                    concat!($op, " zmm1, zmm16, dword ptr [{m} + 4]{{1to16}}"),
                    concat!($op, " zmm2, zmm16, dword ptr [{m} + 8]{{1to16}}"),
                    concat!($op, " zmm3, zmm16, dword ptr [{m} + 12]{{1to16}}"),
                    concat!($op, " zmm4, zmm16, dword ptr [{m} + 16]{{1to16}}"),
                    concat!($op, " zmm5, zmm16, dword ptr [{m} + 20]{{1to16}}"),
                    concat!($op, " zmm6, zmm16, dword ptr [{m} + 24]{{1to16}}"),
                    concat!($op, " zmm7, zmm16, dword ptr [{m} + 28]{{1to16}}"),
                    concat!($op, " zmm8, zmm16, dword ptr [{m} + 32]{{1to16}}"),
                    concat!($op, " zmm9, zmm16, dword ptr [{m} + 36]{{1to16}}"),
                    concat!($op, " zmm10, zmm16, dword ptr [{m} + 40]{{1to16}}"),
                    concat!($op, " zmm11, zmm16, dword ptr [{m} + 44]{{1to16}}"),
                    "dec {n}",
                    "jnz 2b",
                    m = in(reg) memory.as_ptr(),
                    n = inout(reg) iterations => _,
                    out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                    out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                    out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                    out("zmm16") _,
                    options(nostack, readonly),
                )
            };
        }
        match kind {
            "vpdpbusd" => twelve!("vpdpbusd"),
            _ => twelve!("vfmadd231ps"),
        }
    }
    12.0 * iterations as f64 / start.elapsed().as_secs_f64() / 1e9
}

#[cfg(target_arch = "x86_64")]
fn main() {
    if grove_kernels::cpu::Level::supported() < grove_kernels::cpu::Level::Avx512 {
        eprintln!("no AVX-512 VNNI on this CPU: nothing to measure");
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let iterations = 50_000_000;
    for kind in ["vpdpbusd", "vfmadd231ps"] {
        let alone = run(kind, iterations);
        let together: Vec<f64> = std::thread::scope(|scope| {
            let runs: Vec<_> = (0..cores)
                .map(|_| scope.spawn(|| run(kind, iterations)))
                .collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let each: Vec<String> = together.iter().map(|g| format!("{g:.2}")).collect();
        println!(
            "{kind}: {alone:.2} G/s on one core; {} G/s on each of {cores} cores at once",
            each.join(", ")
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("x86-64 only");
}
