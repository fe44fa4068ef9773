"""Throughput and TTFT through one server or a gateway in front of several (docs/deployment.md).

Each of --clients clients sends --requests streamed chats in turn; every prompt starts with one
of --prefixes shared system prompts (--prefix-chars long) and ends with its own question.
Prints requests, wall seconds, output tokens/s, and TTFT mean / p50 / p90:

    python3 scripts/gateway_bench.py --url http://127.0.0.1:30000 --clients 8 --requests 4
"""

import argparse
import concurrent.futures
import json
import statistics
import time

from openai_stream import first_model, stream_chat

WORDS = ("parse the config file, validate every field, retry the request with backoff, "
         "write the result to the cache, log the error with its context and return early ")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--prefixes", type=int, default=4)
    parser.add_argument("--prefix-chars", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    model = first_model(args.url)
    salt = time.time_ns() % 100_000
    prefixes = [f"Project {salt}-{p}. " + (WORDS * 40)[: args.prefix_chars]
                for p in range(args.prefixes)]

    def client(c):
        results = []
        for r in range(args.requests):
            body = {"model": model, "stream": True, "max_tokens": args.max_tokens,
                    "temperature": 0, "ignore_eos": True,
                    "stream_options": {"include_usage": True},
                    "messages": [
                        {"role": "system", "content": prefixes[(c + r) % args.prefixes]},
                        {"role": "user", "content": f"Question {c}.{r}: write a function."},
                    ]}
            results.append(stream_chat(args.url, body))
        return results

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.clients) as pool:
        results = [r for rs in pool.map(client, range(args.clients)) for r in rs]
    wall = time.monotonic() - start
    ttfts = sorted(r["ttft"] for r in results)
    tokens = sum(r["usage"]["completion_tokens"] for r in results)
    print(json.dumps({
        "requests": len(results),
        "wall_seconds": round(wall, 1),
        "output_tokens_per_s": round(tokens / wall, 2),
        "ttft_mean": round(statistics.mean(ttfts), 3),
        "ttft_p50": round(ttfts[len(ttfts) // 2], 3),
        "ttft_p90": round(ttfts[int(len(ttfts) * 0.9)], 3),
    }))


if __name__ == "__main__":
    main()
