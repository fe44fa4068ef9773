//! The instruction peaks the kernels are measured against: 512-bit `vpdpbusd` (with its
//! activation bytes broadcast from memory, as `quant/simd_columns.rs` issues it) and 512-bit
//! `vfmadd231ps`, each over 12 independent sums (more than latency x throughput), on one core
//! and on every core at once; then what a kernel's other instructions cost the `vpdpbusd`s
//! beside them (8 broadcast-fed `vpdpbusd`s and two of another instruction per loop, one core):
//! an instruction that shares their ports, or a load past the load ports' pace, lowers their
//! rate. On a CPU with AVX2 but no AVX-512 VNNI, the AVX2 kernels' step instead
//! (`quant/avx2_columns.rs`: an activation group broadcast from memory, `vpmaddubsw` against
//! a weight vector, `vpaddw` into a row's 16-bit sums), alone and beside the other
//! instructions those kernels issue. `cargo run --release -p grove-kernels --example peak`.

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

/// `vpdpbusd`s per second (G) on this core in a loop of 8 of them, each with its activation
/// bytes broadcast from memory as the kernels issue them (or, with `register` first, from a
/// register: no load), and the two instructions `$a`, `$b` (which write zmm8/zmm9 from
/// zmm16/zmm17 or memory at `{m}`).
#[cfg(target_arch = "x86_64")]
macro_rules! beside {
    (register, $a:literal, $b:literal) => {
        beside!("zmm18", "zmm18", "zmm18", "zmm18", "zmm18", "zmm18", "zmm18", "zmm18", $a, $b)
    };
    ($a:literal, $b:literal) => {
        beside!(
            "dword ptr [{m}]{{1to16}}", "dword ptr [{m} + 4]{{1to16}}",
            "dword ptr [{m} + 8]{{1to16}}", "dword ptr [{m} + 12]{{1to16}}",
            "dword ptr [{m} + 16]{{1to16}}", "dword ptr [{m} + 20]{{1to16}}",
            "dword ptr [{m} + 24]{{1to16}}", "dword ptr [{m} + 28]{{1to16}}",
            $a, $b
        )
    };
    ($s0:literal, $s1:literal, $s2:literal, $s3:literal, $s4:literal, $s5:literal,
     $s6:literal, $s7:literal, $a:literal, $b:literal) => {{
        use std::arch::asm;
        let memory = [1i32; 64];
        let iterations: u64 = 50_000_000;
        let start = std::time::Instant::now();
        // SAFETY: only called where the CPU has AVX-512 VNNI (checked in `main`); the loop
        // reads `memory` (256 bytes) and touches only the registers it names.
        unsafe {
            asm!(
                "vmovdqu32 zmm16, [{m}]",
                "vmovdqu32 zmm17, [{m} + 64]",
                "vmovdqu32 zmm18, [{m} + 128]",
                "2:",
                concat!("vpdpbusd zmm0, zmm16, ", $s0),
                concat!("vpdpbusd zmm1, zmm16, ", $s1),
                concat!("vpdpbusd zmm2, zmm16, ", $s2),
                concat!("vpdpbusd zmm3, zmm16, ", $s3),
                concat!("vpdpbusd zmm4, zmm16, ", $s4),
                concat!("vpdpbusd zmm5, zmm16, ", $s5),
                concat!("vpdpbusd zmm6, zmm16, ", $s6),
                concat!("vpdpbusd zmm7, zmm16, ", $s7),
                $a,
                $b,
                "dec {n}",
                "jnz 2b",
                m = in(reg) memory.as_ptr(),
                n = inout(reg) iterations => _,
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                out("zmm8") _, out("zmm9") _, out("zmm16") _, out("zmm17") _,
                out("zmm18") _,
                options(nostack, readonly),
            )
        };
        8.0 * iterations as f64 / start.elapsed().as_secs_f64() / 1e9
    }};
}

/// [`beside!`] for each kind of instruction the kernels issue between their `vpdpbusd`s.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn mixes() {
    let rates = [
        ("nothing", beside!("nop", "nop")),
        (
            "vfmadd231ps",
            beside!(
                "vfmadd231ps zmm8, zmm16, zmm17",
                "vfmadd231ps zmm9, zmm16, zmm17"
            ),
        ),
        (
            "vcvtdq2ps",
            beside!("vcvtdq2ps zmm8, zmm16", "vcvtdq2ps zmm9, zmm17"),
        ),
        (
            "vpandq",
            beside!("vpandq zmm8, zmm16, zmm17", "vpandq zmm9, zmm16, zmm17"),
        ),
        (
            "vpmulld",
            beside!("vpmulld zmm8, zmm16, zmm17", "vpmulld zmm9, zmm16, zmm17"),
        ),
        (
            "vpdpwssd",
            beside!("vpdpwssd zmm8, zmm16, zmm17", "vpdpwssd zmm9, zmm16, zmm17"),
        ),
        (
            "64-byte load",
            beside!("vmovdqu64 zmm8, [{m} + 128]", "vmovdqu64 zmm9, [{m} + 192]"),
        ),
        (
            "4-byte broadcast",
            beside!(
                "vpbroadcastd zmm8, dword ptr [{m} + 128]",
                "vpbroadcastd zmm9, dword ptr [{m} + 132]"
            ),
        ),
    ];
    println!("vpdpbusd G/s on one core, 8 of them beside two of:");
    for (other, rate) in rates {
        println!("  {other:16} {rate:.2}");
    }
    // Where the vector loads bound the kernels: the same loads beside `vpdpbusd`s that load
    // nothing (a CPU with two vector loads a cycle and two `vpdpbusd`s: the memory-fed ones
    // above already take every load slot).
    let register = [
        ("nothing", beside!(register, "nop", "nop")),
        (
            "4-byte broadcast",
            beside!(
                register,
                "vpbroadcastd zmm8, dword ptr [{m} + 128]",
                "vpbroadcastd zmm9, dword ptr [{m} + 132]"
            ),
        ),
    ];
    println!("the same, their operand a register, beside two of:");
    for (other, rate) in register {
        println!("  {other:16} {rate:.2}");
    }
}

/// `vpmaddubsw`s per second (G) on this core in a loop of 8 of the AVX2 kernels' steps (the
/// activation bytes broadcast from memory, `vpmaddubsw` against a weight vector, `vpaddw` into
/// one of 4 sums), and the instructions `$a` (which write ymm12-ymm13 from ymm14/ymm15 or
/// memory at `{m}`).
#[cfg(target_arch = "x86_64")]
macro_rules! avx2_steps {
    ($($a:literal),*) => {{
        use std::arch::asm;
        let memory = [1i32; 64];
        let iterations: u64 = 50_000_000;
        let start = std::time::Instant::now();
        macro_rules! step {
            ($r:literal, $sum:literal, $k:literal) => {
                concat!(
                    "vpbroadcastd ymm", $r, ", dword ptr [{m} + ", $k, "]\n",
                    "vpmaddubsw ymm", $r, ", ymm15, ymm", $r, "\n",
                    "vpaddw ymm", $sum, ", ymm", $sum, ", ymm", $r
                )
            };
        }
        // SAFETY: only called where the CPU has AVX2 (checked in `main`); the loop reads
        // `memory` (256 bytes) and touches only the registers it names.
        unsafe {
            asm!(
                "vmovdqu ymm14, [{m}]",
                "vmovdqu ymm15, [{m} + 32]",
                "2:",
                step!("0", "8", "0"), step!("1", "9", "4"), step!("2", "10", "8"),
                step!("3", "11", "12"), step!("4", "8", "16"), step!("5", "9", "20"),
                step!("6", "10", "24"), step!("7", "11", "28"),
                $($a,)*
                "dec {n}",
                "jnz 2b",
                m = in(reg) memory.as_ptr(),
                n = inout(reg) iterations => _,
                out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
                out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
                out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
                out("ymm12") _, out("ymm13") _, out("ymm14") _, out("ymm15") _,
                options(nostack, readonly),
            )
        };
        8.0 * iterations as f64 / start.elapsed().as_secs_f64() / 1e9
    }};
}

/// [`avx2_steps!`] beside each kind of instruction the AVX2 kernels issue between their steps:
/// a weight group's decode (`vpand`, `vpsrlw`: a nibble vector's two groups cost three of
/// them), a sub-block's widening (`vpmaddwd` then `vpaddd`), Q8_0's `vpsignb`.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn avx2_mixes() {
    let rates = [
        ("nothing", avx2_steps!()),
        (
            "2 vpand",
            avx2_steps!("vpand ymm12, ymm14, ymm15", "vpand ymm13, ymm14, ymm15"),
        ),
        (
            "2 vpsrlw",
            avx2_steps!("vpsrlw ymm12, ymm14, 4", "vpsrlw ymm13, ymm14, 4"),
        ),
        (
            "2 vpmaddwd",
            avx2_steps!(
                "vpmaddwd ymm12, ymm14, ymm15",
                "vpmaddwd ymm13, ymm14, ymm15"
            ),
        ),
        (
            "2 vpsignb",
            avx2_steps!("vpsignb ymm12, ymm14, ymm15", "vpsignb ymm13, ymm14, ymm15"),
        ),
        (
            "2 32-byte loads",
            avx2_steps!("vmovdqu ymm12, [{m} + 64]", "vmovdqu ymm13, [{m} + 96]"),
        ),
    ];
    println!("vpmaddubsw G/s on one core, 8 steps (broadcast, vpmaddubsw, vpaddw) beside:");
    for (other, rate) in rates {
        println!("  {other:16} {rate:.2}");
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    use grove_kernels::cpu::Level;
    if Level::supported() < Level::Avx512 {
        if Level::supported() < Level::Avx2 {
            eprintln!("no AVX2 on this CPU: nothing to measure");
        } else {
            avx2_mixes();
        }
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
    mixes();
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("x86-64 only");
}
