"""Per-key limits: sliding minutes for requests and tokens, a live count for concurrency."""

from __future__ import annotations

import asyncio

import pytest

from gateway.ops.keys import KeyFileError, parse_key_file
from gateway.ops.limits import KeyLimiter, Limits


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_key_file_takes_limits_after_the_label_or_the_key() -> None:
    rows = parse_key_file("sk-a-0123456789 alice rpm=60 tpm=5000\nsk-b-0123456789 concurrent=2\n")
    assert rows[0][1:] == ("alice", Limits(rpm=60, tpm=5000))
    assert rows[1][2] == Limits(concurrent=2) and rows[1][1].startswith("key-")
    for bad in ("rpm=0", "rpm=-1", "rpm=x", "burst=3", "alice bob"):
        with pytest.raises(KeyFileError, match="line 1"):
            parse_key_file(f"sk-a-0123456789 {bad}")


def test_requests_per_minute_slide_and_say_when_to_come_back() -> None:
    clock = Clock()
    lim = KeyLimiter(clock)
    rpm = Limits(rpm=2)
    assert lim.admit("a", rpm) is None
    clock.now += 10
    assert lim.admit("a", rpm) is None
    refusal = lim.admit("a", rpm)
    assert refusal is not None and refusal.limit == "rpm" and refusal.retry_after_s == 50
    assert lim.admit("b", rpm) is None, "another key has its own minute"
    clock.now += 50
    assert lim.admit("a", rpm) is None, "the first request left the window"
    assert lim.snapshot()["a"][3] == {"rpm": 1}


def test_concurrency_counts_until_release() -> None:
    lim = KeyLimiter(Clock())
    one = Limits(concurrent=1)
    assert lim.admit("a", one) is None
    refusal = lim.admit("a", one)
    assert refusal is not None and refusal.limit == "concurrent" and refusal.retry_after_s >= 1
    lim.release("a")
    assert lim.admit("a", one) is None


def test_tokens_per_minute_refuse_until_enough_tokens_age_out() -> None:
    clock = Clock()
    lim = KeyLimiter(clock)
    tpm = Limits(tpm=100)
    assert lim.admit("a", tpm) is None
    lim.spend("a", 60)
    clock.now += 20
    assert lim.admit("a", tpm) is None, "60 < 100: admitted, and it may end above the limit"
    lim.spend("a", 70)
    clock.now += 5
    refusal = lim.admit("a", tpm)
    # 130 in the minute; once the first 60 age out (35 s from now) 70 remain, under 100
    assert refusal is not None and refusal.limit == "tpm" and refusal.retry_after_s == 35
    clock.now += 35
    assert lim.admit("a", tpm) is None
    lim.spend("never-admitted", 10**9)
    assert "never-admitted" not in lim.snapshot(), "callers without limits are not tracked"


async def test_a_request_over_its_concurrency_waits_for_one_that_is_ending() -> None:
    lim = KeyLimiter()
    one = Limits(concurrent=1)
    assert await lim.enter("a", one) is None
    # The last one ends while the next waits: the OpenAI SDK sends its next request once it has read
    # `[DONE]`, before the server has closed the stream that sent it.
    loop = asyncio.get_running_loop()
    loop.call_later(0.02, lim.release, "a")
    started = loop.time()
    assert await lim.enter("a", one, grace_s=5) is None
    assert loop.time() - started < 4, "admitted when the other ended, not at the grace's end"
    assert lim.snapshot()["a"][2:] == (1, {}), "one in flight, nothing refused"


async def test_past_the_grace_it_is_refused_once_and_other_limits_do_not_wait() -> None:
    lim = KeyLimiter()
    one = Limits(concurrent=1)
    assert await lim.enter("a", one) is None
    refusal = await lim.enter("a", one, grace_s=0.05)
    assert refusal is not None and refusal.limit == "concurrent"
    assert lim.snapshot()["a"][3] == {"concurrent": 1}
    rpm = Limits(rpm=1)
    assert await lim.enter("b", rpm) is None
    loop = asyncio.get_running_loop()
    started = loop.time()
    refusal = await lim.enter("b", rpm, grace_s=5)
    assert refusal is not None and refusal.limit == "rpm" and loop.time() - started < 1
    assert not lim._waiting, "no waiter is left behind"
