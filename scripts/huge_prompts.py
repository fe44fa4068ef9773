"""Huge prompts do not stall the server (issue 26, item 2).

Sends --count requests at once, each with a prompt of about --megabytes MB (half completions,
half chat; code-like text, or one unbroken word with --no-spaces), while polling `GET /health`
every 50 ms. Prints each request's status and seconds and the slowest /health answer:

    python3 scripts/huge_prompts.py --url http://127.0.0.1:8000 --count 4 --megabytes 3.9
"""

import argparse
import http.client
import json
import threading
import time
import urllib.parse

from openai_stream import first_model, poll_health


def post(url, path, body):
    parsed = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=900)
    start = time.monotonic()
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    reply = response.read()
    conn.close()
    return response.status, time.monotonic() - start, reply[:200]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--count", type=int, default=4)
    parser.add_argument("--megabytes", type=float, default=3.9)
    parser.add_argument("--no-spaces", action="store_true",
                        help="one unbroken word instead of code-like lines")
    args = parser.parse_args()
    model = first_model(args.url)
    size = int(args.megabytes * 1_000_000)
    unit = "x" if args.no_spaces else "for item in range(10): print(item * 3)\n"
    text = (unit * (size // len(unit) + 1))[:size]

    results, health, done = [None] * args.count, [], threading.Event()

    def send(i):
        if i % 2:
            path = "/v1/chat/completions"
            body = {"model": model, "max_tokens": 4,
                    "messages": [{"role": "user", "content": text}]}
        else:
            path = "/v1/completions"
            body = {"model": model, "max_tokens": 4, "prompt": text}
        results[i] = post(args.url, path, json.dumps(body))

    poller = threading.Thread(target=poll_health, args=(args.url, health, done, 0.05))
    poller.start()
    senders = [threading.Thread(target=send, args=(i,)) for i in range(args.count)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    done.set()
    poller.join()
    for i, (status, seconds, reply) in enumerate(results):
        print(f"request {i}: {status} in {seconds:.2f} s: {reply.decode(errors='replace')}")
    print(f"/health: {len(health)} answers, slowest {max(health):.3f} s")


if __name__ == "__main__":
    main()
