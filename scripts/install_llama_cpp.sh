#!/usr/bin/env bash
# Installs llama-cpp-python, llama.cpp's Python binding, as grove's reference for the GGUF
# agreement tests and `grove bench --compare-llama-cpp`.
#
# PyPI ships it as source only: building llama.cpp takes about 12 minutes on two cores. The
# built wheel is kept under $GROVE_WHEEL_CACHE (default ~/.cache/grove/wheels), outside the
# repo, in a folder named for the instruction sets it was built with, and installed from there
# on later runs; a machine whose CPU differs builds its own.
#
# Not GGML_NATIVE: on the Intel Xeons with AMX seen here, a native build enables llama.cpp's
# AMX kernels, which die with SIGILL at `tileloadd` (tinygemm_kernel_amx<block_q8_0>). The
# build names each x86 extension this CPU has (from /proc/cpuinfo) and leaves AMX off.
set -euo pipefail
version=0.3.36
base="${GROVE_WHEEL_CACHE:-$HOME/.cache/grove/wheels}"

flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
isa=()
for pair in sse4_2:SSE42 avx:AVX avx_vnni:AVX_VNNI avx2:AVX2 bmi2:BMI2 fma:FMA f16c:F16C \
    avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
  if [[ "$flags" == *" ${pair%%:*} "* ]]; then
    isa+=("-DGGML_${pair#*:}=ON")
  else
    isa+=("-DGGML_${pair#*:}=OFF")
  fi
done
isa+=(-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
cache="$base/$(printf '%s\n' "${isa[@]}" | sha256sum | cut -c1-12)"

pip_install() {
  python3 -m pip install --quiet "$@" 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages "$@"
}

# The installed binding counts only if it was built from this cache (this CPU's flags).
if [ -f "$cache/installed" ] \
  && python3 -c "import sys, llama_cpp; sys.exit(llama_cpp.__version__ != '$version')" 2>/dev/null; then
  exit 0
fi
wheel="$(ls "$cache"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -n 1 || true)"
if [ -z "$wheel" ]; then
  mkdir -p "$cache"
  echo "building llama-cpp-python $version (about 12 minutes on 2 cores; kept in $cache)" >&2
  echo "llama.cpp built with: ${isa[*]}" >&2
  # --no-cache-dir: pip would otherwise reuse a wheel it built from the same source with other
  # CMAKE_ARGS (a native one, AMX included).
  CMAKE_ARGS="-DGGML_NATIVE=OFF ${isa[*]} -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    python3 -m pip wheel --quiet --no-deps --no-cache-dir "llama-cpp-python==$version" -w "$cache"
  wheel="$(ls "$cache"/llama_cpp_python-"$version"-*.whl | head -n 1)"
fi
# The wheel replaces any other build of the same version (--force-reinstall, without
# reinstalling its dependencies), then a plain install of it brings the dependencies a fresh
# machine lacks (numpy, diskcache, jinja2, typing-extensions): without them `import llama_cpp`
# fails.
pip_install --force-reinstall --no-deps "$wheel"
pip_install "$wheel"
python3 -c "import llama_cpp" || { echo "error: llama_cpp does not import" >&2; exit 1; }
touch "$cache/installed"
