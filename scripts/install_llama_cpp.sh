#!/usr/bin/env bash
# Installs llama-cpp-python, llama.cpp's Python binding, as grove's reference for the GGUF
# agreement tests and `grove bench --compare-llama-cpp`.
#
# PyPI ships it as source only: building llama.cpp takes about 12 minutes on two cores. The
# built wheel is kept in $GROVE_WHEEL_CACHE (default ~/.cache/grove/wheels), outside the repo,
# and installed from there on later runs. It is built for this CPU (GGML_NATIVE): delete the
# cache after moving to a different kind of machine.
set -euo pipefail
version=0.3.36
cache="${GROVE_WHEEL_CACHE:-$HOME/.cache/grove/wheels}"

pip_install() {
  python3 -m pip install --quiet "$@" 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages "$@"
}

if python3 -c "import sys, llama_cpp; sys.exit(llama_cpp.__version__ != '$version')" 2>/dev/null; then
  exit 0
fi
wheel="$(ls "$cache"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -n 1 || true)"
if [ -z "$wheel" ]; then
  mkdir -p "$cache"
  echo "building llama-cpp-python $version (about 12 minutes on 2 cores; kept in $cache)" >&2
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    python3 -m pip wheel --quiet --no-deps "llama-cpp-python==$version" -w "$cache"
  wheel="$(ls "$cache"/llama_cpp_python-"$version"-*.whl | head -n 1)"
fi
pip_install "$wheel"
