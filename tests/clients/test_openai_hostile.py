"""The OpenAI-compatible client against a hostile server on loopback (helpers/hostile_server.py), in-process.

Every request ends within its total deadline (a dripping body, headers that never end), no response grows past
the size cap (a never-ending chunked body, 300 MB), bodies are strict JSON objects (NaN, Infinity, 1e400,
100k-deep nesting, an array, HTML), ``Retry-After: nan`` never reaches ``time.sleep``, and the API key is
checked before any request and never appears in an error, even when the server quotes it back. ``stop()`` ends
a request in flight, or a wait before a retry, at once.
"""

from __future__ import annotations

import threading
import time
import tracemalloc

import pytest
from helpers.hostile_server import HostileServer

from echo_trl.clients.openai import (
    BadResponse,
    ClientError,
    InferenceServerError,
    OpenAIClient,
    Stopped,
    backoff_seconds,
    retry_after_seconds,
)
from echo_trl.redact import MASK, redact, register_secret

BODY = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def server():
    with HostileServer([1, 2, 3]) as srv:
        yield srv


def client(server, mode: str, **kw) -> OpenAIClient:
    return OpenAIClient(server.url(mode), "m", logprobs="on", **{"max_retries": 0, "backoff": 0.0, **kw})


def test_a_valid_completion_comes_back_as_sent(server):
    out = client(server, "ok").complete(BODY)
    assert out["choices"][0]["token_ids"] == [1, 2, 3]


@pytest.mark.parametrize("mode", ["drip", "endless_headers"])
def test_a_slow_server_is_cut_at_the_total_deadline(server, mode):
    c = client(server, mode, timeout=1.5)
    t0 = time.monotonic()
    with pytest.raises(InferenceServerError, match="total deadline") as err:
        c.complete(BODY)
    elapsed = time.monotonic() - t0
    # httpx's per-read timeout alone never fires here (a byte or a header line each second)
    assert 1.4 <= elapsed < 4.0, elapsed
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("mode", ["endless_chunked", "big_body"])
def test_a_response_over_the_size_cap_is_refused_while_it_streams(server, mode):
    c = client(server, mode, max_response_bytes=4 << 20, timeout=60)
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(BadResponse, match="over 4194304 bytes"):
            c.complete(BODY)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, peak  # the 300 MB / endless body is never held
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize(
    ("mode", "needle"),
    [
        ("nan_logprob", "NaN is not a JSON number"),
        ("inf_logprob", "Infinity is not a JSON number"),
        ("overflow_logprob", "1e400 overflows a float"),
        ("nan_argument", "NaN is not a JSON number"),
        ("deep_json", "nested too deeply"),
        ("list_body", "a JSON list, not an object"),
        ("not_json", "not strict JSON"),
    ],
)
def test_a_body_that_is_not_a_strict_json_object_is_a_bad_response(server, mode, needle):
    with pytest.raises(BadResponse, match="response") as err:
        client(server, mode).complete(BODY)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_retry_after_nan_falls_back_to_the_clients_own_backoff(server):
    c = client(server, "retry_after_nan", max_retries=1, backoff=0.05)
    t0 = time.monotonic()
    assert c.complete(BODY)["choices"][0]["token_ids"] == [1, 2, 3]
    assert time.monotonic() - t0 < 5 and server.requests["retry_after_nan"] == 2


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", "-1", "1e3", "Wed, 21 Oct 2015 07:28:00 GMT", ""])
def test_retry_after_is_read_only_as_plain_seconds(value):
    assert retry_after_seconds(value) is None
    assert 0 <= backoff_seconds(0, 0.5, value) <= 0.55


def test_retry_after_is_capped():
    assert retry_after_seconds("7") == 7.0 and retry_after_seconds("999999999") == 60.0
    assert backoff_seconds(0, 1.0, "999999999", cap=30.0) == 60.0


@pytest.mark.parametrize(("key", "kind"), [("sk-secret-1234\r", "control"), ("sk-sécret-1234", "non-ASCII")])
def test_an_api_key_that_cannot_be_a_header_is_refused_before_any_request_without_showing_it(server, key, kind):
    before = dict(server.requests)
    with pytest.raises(ClientError, match=kind) as err:
        OpenAIClient(server.url("ok"), "m", api_key=key, key_source="the API key in $MY_KEY")
    assert "$MY_KEY" in str(err.value) and "secret" not in str(err.value)
    assert server.requests == before


def test_a_401_quoting_the_authorization_header_is_redacted(server):
    key = "sk-live-0123456789abcdef"
    c = client(server, "unauthorized", api_key=key)
    with pytest.raises(InferenceServerError, match="HTTP 401") as err:
        c.complete(BODY)
    assert server.authorization == f"Bearer {key}"  # the server did receive (and quote) it
    assert key not in str(err.value) and MASK in str(err.value)


def test_redact_covers_registered_keys_and_any_authorization_or_bearer_value():
    register_secret("sk-registered-42\n")
    text = redact("sent 'sk-registered-42\\n' with Authorization: Bearer abc.def and authorization=xyz")
    assert "sk-registered-42" not in text and "abc.def" not in text and "xyz" not in text
    assert redact("token ids differ at token 3 (basic test)") == "token ids differ at token 3 (basic test)"
    assert (
        redact("server https://me:hunter2x@api.example/v1 failed") == f"server https://me:{MASK}@api.example/v1 failed"
    )


@pytest.mark.parametrize("mode", ["drip", "endless_headers", "retry_after_nan"])
def test_stop_ends_a_request_in_flight_or_a_wait_before_a_retry_and_sends_no_other(mode):
    """A 600 s deadline and a 30 s back-off (``retry_after_nan``: HTTP 429 first): stop() from another thread
    ends the call within the 20 s join, and no request is sent after it."""
    with HostileServer([1, 2, 3]) as srv:  # its own: the request count is this test's
        c = client(srv, mode, timeout=600, max_retries=1, backoff=600.0)
        raised: list[BaseException] = []

        def call() -> None:
            try:
                c.complete(BODY)
            except Exception as exc:  # noqa: BLE001 - what the caller sees
                raised.append(exc)

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        while not srv.requests:
            time.sleep(0.05)
        time.sleep(0.5)  # the server is answering (or the 429 came back and the client waits to retry)
        c.stop()
        caller.join(timeout=20)
        assert not caller.is_alive() and len(raised) == 1 and isinstance(raised[0], Stopped), raised
        with pytest.raises(Stopped, match="no request sent"):
            c.complete(BODY)
        assert srv.requests == {mode: 1}
