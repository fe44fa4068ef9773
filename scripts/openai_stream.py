"""A streamed OpenAI chat completion over http.client, for the load and TTFT scripts."""

import http.client
import json
import time
import urllib.parse


def first_model(url):
    """The id of the first model `GET /v1/models` lists."""
    parsed = urllib.parse.urlparse(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
    connection.request("GET", "/v1/models")
    return json.loads(connection.getresponse().read())["data"][0]["id"]


def stream_chat(url, body):
    """Posts `body` to /v1/chat/completions as a stream. Returns a dict: `ttft` (seconds to
    the first content, or to the end if none came), `last` (seconds to the last content),
    `text`, `usage`, `finish` (the last finish_reason) and `done` (whether `[DONE]` came); or
    raises RuntimeError naming what went wrong (a status other than 200, an error event)."""
    parsed = urllib.parse.urlparse(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=900)
    start = time.monotonic()
    connection.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps(body),
        headers={"Content-Type": "application/json"},
    )
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"status {response.status}: {response.read()[:300]!r}")
    result = {"ttft": None, "last": None, "text": "", "usage": None, "finish": None,
              "done": False}
    for raw in response:
        line = raw.decode().strip()
        if line == "data: [DONE]":
            result["done"] = True
        if not line.startswith("data: ") or result["done"]:
            continue
        event = json.loads(line[len("data: "):])
        if "error" in event:
            raise RuntimeError(f"error event: {event['error']}")
        result["usage"] = event.get("usage") or result["usage"]
        for choice in event.get("choices", []):
            content = choice.get("delta", {}).get("content")
            if content:
                if result["ttft"] is None:
                    result["ttft"] = time.monotonic() - start
                result["last"] = time.monotonic() - start
                result["text"] += content
            result["finish"] = choice.get("finish_reason") or result["finish"]
    connection.close()
    if result["ttft"] is None:
        result["ttft"] = time.monotonic() - start
    if result["last"] is None:
        result["last"] = result["ttft"]
    return result


def poll_health(url, latencies, stop, interval):
    """Until `stop` (a threading.Event) is set, asks `GET /health` every `interval` seconds on
    a fresh connection and appends each answer's latency to `latencies`."""
    parsed = urllib.parse.urlparse(url)
    while not stop.is_set():
        start = time.monotonic()
        connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
        connection.request("GET", "/health")
        connection.getresponse().read()
        connection.close()
        latencies.append(time.monotonic() - start)
        time.sleep(interval)
