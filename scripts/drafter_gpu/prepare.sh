#!/usr/bin/env bash
# Prepares a drafter-training lease (README.md beside this file): code prompts cut from this
# machine's Python sources, tokenized with the target's own tokenizer, a tiny random target for
# the lease's smoke run, and the target GGUF cut into pieces that one lease call can carry.
#
#   bash scripts/drafter_gpu/prepare.sh TARGET.gguf [OUT_DIR, default .xfer]
set -euo pipefail
cd "$(dirname "$0")/../.."
model=${1:?usage: prepare.sh TARGET.gguf [OUT_DIR]}
out=${2:-.xfer}
here=scripts/drafter_gpu
mkdir -p "$out"
grep -qx "/$out/" .git/info/exclude 2>/dev/null || echo "/$out/" >> .git/info/exclude

# Train on the standard library and every site package but three; the three are held out.
stdlib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
held_out=(IPython aiohttp anyio)
eval_dirs=()
for name in "${held_out[@]}"; do [ -d "$site/$name" ] && eval_dirs+=("$site/$name"); done
[ ${#eval_dirs[@]} -gt 0 ] || { echo "none of ${held_out[*]} under $site to hold out" >&2; exit 1; }
train_dirs=()
for dir in "$stdlib"/*/ "$site"/*/; do
  case "$dir" in
    */site-packages/|*dist-info/|*/__pycache__/) continue ;;
  esac
  skip=
  for name in "${held_out[@]}"; do [ "${dir%/}" = "$site/$name" ] && skip=1; done
  [ -z "$skip" ] && [ -d "$dir" ] && train_dirs+=("$dir")
done
python3 "$here/prompts.py" --train "${train_dirs[@]}" --eval "${eval_dirs[@]}" --out "$out/texts.json"

cargo build --release -p grove-model --example tokenize_texts
tokenize=target/release/examples/tokenize_texts
python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
texts = json.load(open(f"{out}/texts.json"))
for split in ("train", "eval"):
    json.dump(texts[split], open(f"{out}/{split}.json", "w"))
EOF
"$tokenize" "$model" "$out/train.json" "$out/train_ids.json"
"$tokenize" "$model" "$out/eval.json" "$out/eval_ids.json"
python3 - "$out" <<'EOF'
import gzip, json, sys
out = sys.argv[1]
ids = {split: json.load(open(f"{out}/{split}_ids.json")) for split in ("train", "eval")}
with gzip.open(f"{out}/prompts.json.gz", "wt") as f:
    json.dump(ids, f)
EOF
python3 "$here/tiny_gguf.py" "$out/tiny.gguf"

# Pieces: the first shares its call with the scripts, the prompts and the tiny target; every
# call carries at most 64 MiB.
python3 - "$model" "$out" <<'EOF'
import os, sys
model, out = sys.argv[1], sys.argv[2]
limit = 64 << 20
extra = sum(os.path.getsize(f"{out}/{f}") for f in ("tiny.gguf", "prompts.json.gz")) + 300_000
sizes, total = [limit - extra], os.path.getsize(model)
while sum(sizes) < total:
    sizes.append(min(66_000_000, total - sum(sizes)))
with open(model, "rb") as f:
    for i, size in enumerate(sizes):
        with open(f"{out}/p{i:02d}", "wb") as piece:
            piece.write(f.read(size))
print(f"{len(sizes)} pieces of {model}")
EOF
sha256sum "$model"
