#!/usr/bin/env bash
# Runs the AVX-512 VNNI kernels' tests under Miri, which interprets every instruction: the
# AVX-512 products can be checked on a CPU without AVX-512 (Miri runs the instructions the
# kernels use but for `vcvtph2ps` on 512 bits, `vpermw`, `cpuid` and inline assembly; the
# kernels give Miri the same arithmetic there, under `cfg(miri)`, and take the Q6_K zero point
# form of CPUs other than Zen 5). Slow: about 4 minutes to build for
# Miri (once; more on a machine that first builds Miri's standard library), then about 2
# minutes per format.
#
#   bash scripts/miri_avx512.sh            # the AVX-512 kernels against AVX2's, every format
#   bash scripts/miri_avx512.sh <filter>   # other grove-kernels tests under Miri
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo +nightly miri --version >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal --component miri
fi
features=avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512dq,avx512vnni,avx512vl
export RUSTFLAGS="-C target-feature=+${features//,/,+}"
# Tree borrows: crossbeam-epoch (under rayon) breaks stacked borrows' stricter rules; rayon's
# pool threads outlive the test (leaks ignored).
export MIRIFLAGS="-Zmiri-tree-borrows -Zmiri-permissive-provenance -Zmiri-disable-data-race-detector -Zmiri-ignore-leaks"
export RAYON_NUM_THREADS=1
cargo +nightly miri test -p grove-kernels --lib -- --nocapture \
    "${1:-quant::tests::avx512_agrees_with_avx2_under_miri}"
