"""Code prompts for drafter training, cut from Python sources on this machine: a function's
header (and its docstring, when it has one), sometimes with the lines of its file before it,
sometimes cut a few lines into its body, and some as a chat request for the function. Train
and held-out prompts come from disjoint directory trees, so no held-out file is trained on.

    python3 prompts.py --train DIR... --eval DIR... --out texts.json
"""

import argparse
import ast
import json
import os
import random

CHAT = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n{request}<|im_end|>\n<|im_start|>assistant\n"
)


def sources(roots):
    for root in roots:
        if os.path.isfile(root):
            yield root
            continue
        for directory, subdirs, files in os.walk(root):
            subdirs[:] = sorted(d for d in subdirs if d not in ("test", "tests", "__pycache__", "idle_test"))
            for name in sorted(files):
                if name.endswith(".py"):
                    yield os.path.join(directory, name)


def functions(path):
    """(first line, last header line, docstring end line, body end, name, docstring) of each
    function in the file, 0-based lines; None when it does not parse."""
    try:
        text = open(path, encoding="utf-8").read()
        tree = ast.parse(text)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return text if "text" in locals() else "", []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.lineno - 1 if not node.decorator_list else node.decorator_list[0].lineno - 1
            body = node.body[0]
            doc = ast.get_docstring(node)
            header_end = body.lineno - 2
            doc_end = body.end_lineno - 1 if doc else header_end
            found.append((first, header_end, doc_end, node.end_lineno - 1, node.name, doc))
    return text, found


def prompts_of(path, rng):
    text, found = functions(path)
    lines = text.splitlines(keepends=True)
    out = []
    for first, header_end, doc_end, end, name, doc in found:
        if end - doc_end < 2 or end - first > 120:
            continue
        kind = rng.random()
        if kind < 0.15 and doc:
            summary = doc.strip().split("\n\n")[0].replace("\n", " ")
            header = "".join(lines[first : header_end + 1]).strip()
            out.append(CHAT.format(request=f"Write a Python function `{header}`: {summary}"))
            continue
        stop = doc_end + 1
        if kind > 0.75:
            stop = min(end, doc_end + 1 + rng.randint(1, 4))
        begin = first
        if 0.4 < kind < 0.75:
            begin = max(0, first - rng.randint(5, 40))
        body = "".join(lines[begin:stop])
        if kind > 0.9 and stop < end:
            # Cut inside a line, as a user's prompt often ends mid-statement.
            line = lines[stop]
            body += line[: rng.randint(0, max(0, len(line.rstrip()) - 1))]
        out.append(body)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--train", nargs="+", required=True)
    p.add_argument("--eval", nargs="+", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-train", type=int, default=16384)
    p.add_argument("--max-eval", type=int, default=192)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = random.Random(a.seed)
    result = {}
    for split, roots, limit in (("train", a.train, a.max_train), ("eval", a.eval, a.max_eval)):
        texts = [t for path in sources(roots) for t in prompts_of(path, rng) if 8 <= len(t) <= 6000]
        rng.shuffle(texts)
        result[split] = texts[:limit]
        print(f"{split}: {len(texts)} prompts, kept {len(result[split])}")
    json.dump(result, open(a.out, "w"))


if __name__ == "__main__":
    main()
