"""What the client scripts share: the client for the server at argv[1], and counted checks."""

import sys

import openai

client = openai.OpenAI(base_url=f"{sys.argv[1]}/v1", api_key="unused", max_retries=0, timeout=120)
passed = 0


def check(condition, message):
    """Raises with `message` unless `condition`; counts the checks that held."""
    global passed
    if not condition:
        raise AssertionError(message)
    passed += 1
