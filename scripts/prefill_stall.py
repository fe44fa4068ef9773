"""How long a running stream waits while a long prompt prefills (issue 26, item 1).

Starts one streamed chat completion, waits until it is decoding, then sends a long prompt
(non-streaming, one output token) and, while it runs, polls `/health`. Reports the longest
gap between the stream's events during the long prompt's prefill, the long request's latency
and the slowest `/health` answer. Run against `grove serve` (default --prefill-step-ms) and
against `grove serve --prefill-step-ms 0` (whole chunks) to compare:

    python3 scripts/prefill_stall.py --url http://127.0.0.1:8000 --prompt-chars 16000
"""

import argparse
import http.client
import json
import os
import threading
import time
import urllib.parse

from openai_stream import first_model, poll_health


def connection(url, timeout=900):
    parsed = urllib.parse.urlparse(url)
    return http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout)


def stream_events(url, body, times, decoding):
    """Streams `body`, appending each event's arrival time to `times`; sets `decoding` after
    the fifth content event."""
    conn = connection(url)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200, response.read()[:300]
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        times.append(time.monotonic())
        if len(times) >= 5:
            decoding.set()
        if line == "data: [DONE]":
            break
    conn.close()


def long_prompt(chars):
    """Code-like text of about `chars` characters (~4 per token), different on every run so
    that no prefix cache shortens it."""
    salt = time.time_ns()
    lines, size, i = [], 0, 0
    while size < chars:
        line = f"def handler_{salt % 9973}_{i}(request, limit={i % 17}):  # route {i}\n" \
               f"    return [item * {i} for item in request.items[:limit]]\n"
        lines.append(line)
        size += len(line)
        i += 1
    return "".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", help="default: the first model /v1/models lists")
    parser.add_argument("--prompt-chars", type=int, default=16000,
                        help="length of the long prompt (about 4 characters a token)")
    parser.add_argument("--stream-tokens", type=int, default=4000,
                        help="max_tokens of the running stream (it must outlast the prefill)")
    args = parser.parse_args()
    model = args.model or first_model(args.url)

    times, decoding = [], threading.Event()
    stream_body = {
        "model": model, "stream": True, "max_tokens": args.stream_tokens, "ignore_eos": True,
        "messages": [{"role": "user", "content": "Count from one upward in words."}],
    }
    streamer = threading.Thread(target=stream_events,
                                args=(args.url, stream_body, times, decoding))
    streamer.start()
    decoding.wait(timeout=600)

    health, stop_health = [], threading.Event()

    poller = threading.Thread(target=poll_health, args=(args.url, health, stop_health, 0.2))
    poller.start()
    long_body = {"model": model, "max_tokens": 1,
                 "messages": [{"role": "user", "content": long_prompt(args.prompt_chars)}]}
    sent = time.monotonic()
    conn = connection(args.url)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(long_body),
                 headers={"Content-Type": "application/json"})
    reply = json.loads(conn.getresponse().read())
    done = time.monotonic()
    stop_health.set()
    poller.join()
    prompt_tokens = reply["usage"]["prompt_tokens"]

    window = [t for t in times if sent <= t <= done]
    marks = [sent] + window + [done]
    gaps = [b - a for a, b in zip(marks, marks[1:])]
    print(json.dumps({
        "long_prompt_tokens": prompt_tokens,
        "long_request_seconds": round(done - sent, 2),
        "stream_events_during_prefill": len(window),
        "longest_stream_gap_seconds": round(max(gaps), 3),
        "slowest_health_seconds": round(max(health), 3) if health else None,
    }, indent=1))
    # The stream is not needed any more: the server cancels it when the connection closes.
    os._exit(0)


if __name__ == "__main__":
    main()
