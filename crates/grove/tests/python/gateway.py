"""grove replicas behind SGLang's model gateway (sglang-router), one phase per call.

    python3 gateway.py spread ROUTER REPLICA_A REPLICA_B   # listing, 16 requests on both
    python3 gateway.py affinity ROUTER REPLICA_A REPLICA_B  # cache_aware: a prefix, a replica
    python3 gateway.py failover ROUTER                      # 8 requests after a replica died

Exits non-zero naming the first check that failed; prints "checks passed".
"""

import concurrent.futures
import http.client
import json
import sys
import time
import urllib.parse


def request(url, method, path, body=None, timeout=120):
    parsed = urllib.parse.urlparse(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    connection.request(method, path, body=None if body is None else json.dumps(body),
                       headers=headers)
    response = connection.getresponse()
    data = response.read().decode()
    connection.close()
    return response.status, data


def check(condition, message):
    if not condition:
        print(f"FAILED: {message}")
        sys.exit(1)


def wait_for_model(router):
    """The gateway lists grove's model once it has registered a worker."""
    deadline = time.monotonic() + 90
    last = None
    while time.monotonic() < deadline:
        try:
            status, data = request(router, "GET", "/v1/models", timeout=5)
            last = (status, data)
            if status == 200:
                ids = [m["id"] for m in json.loads(data)["data"]]
                if "grove-default" in ids:
                    return ids
        except OSError as error:
            last = error
        time.sleep(0.5)
    check(False, f"the gateway never listed grove-default: {last}")


def one(router, i):
    """Request `i`: completions or chat, streamed or not; returns the text it got."""
    chat = i % 2 == 1
    stream = i % 4 >= 2
    body = {"model": "grove-default", "max_tokens": 8, "temperature": 0, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": f"def f{i}(x):"}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = f"def g{i}(x):"
        path = "/v1/completions"
    status, data = request(router, "POST", path, body)
    check(status == 200, f"request {i}: status {status}: {data[:300]}")
    if stream:
        check(data.rstrip().endswith("data: [DONE]"), f"request {i}: no [DONE]: {data[-200:]}")
        return "stream"
    choice = json.loads(data)["choices"][0]
    return choice["message"]["content"] if chat else choice["text"]


def served(replica):
    """Requests a replica answered (its grove_requests_total over every outcome)."""
    status, data = request(replica, "GET", "/metrics")
    check(status == 200, f"{replica}/metrics: {status}")
    return sum(float(line.split()[-1]) for line in data.splitlines()
               if line.startswith("grove_requests_total{"))


def burst(router, count):
    with concurrent.futures.ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(lambda i: one(router, i), range(count)))


def main():
    phase, router = sys.argv[1], sys.argv[2]
    if phase == "spread":
        replicas = sys.argv[3:5]
        ids = wait_for_model(router)
        print(f"gateway lists {ids}")
        before = [served(r) for r in replicas]
        burst(router, 16)
        after = [served(r) for r in replicas]
        counts = [a - b for a, b in zip(after, before)]
        print(f"16 requests through the gateway: {counts} per replica")
        check(all(c > 0 for c in counts), f"the requests did not reach both replicas: {counts}")
        check(sum(counts) == 16, f"{sum(counts)} requests reached the replicas, not 16")
    elif phase == "affinity":
        replicas = sys.argv[3:5]
        wait_for_model(router)
        for p in range(4):
            prefix = f"# module {p}: " + " ".join(f"word{p}_{w}" for w in range(120)) + "\n"
            landed = set()
            for q in range(3):
                before = [served(r) for r in replicas]
                body = {"model": "grove-default", "max_tokens": 4, "temperature": 0,
                        "prompt": prefix + f"def q{q}():"}
                status, data = request(router, "POST", "/v1/completions", body)
                check(status == 200, f"prefix {p} request {q}: {status}: {data[:200]}")
                after = [served(r) for r in replicas]
                landed |= {i for i in range(2) if after[i] > before[i]}
            print(f"prefix {p}: replicas {sorted(landed)}")
            check(len(landed) == 1, f"prefix {p}'s requests went to replicas {sorted(landed)}")
    elif phase == "failover":
        burst(router, 8)
        print("8 requests after a replica was killed: all answered")
    print("checks passed")


if __name__ == "__main__":
    main()
