"""A request's priority (protocol/priority.py, gateway/http/priority.py): the header within its
key's ceiling, the models file's default, and the queue's aging bound."""

from __future__ import annotations

from typing import Any, cast

import pytest
from litestar.connection import ASGIConnection

from gateway.errors import BadRequest
from gateway.http.auth import KEY_PRIORITY
from gateway.http.priority import priority_of
from protocol.priority import AGING_S, queue_rank


class _Fake:
    def __init__(self, header: str | None, key_priority: str | None) -> None:
        self.headers = {"GenieX-Priority": header} if header is not None else {}
        self.scope: dict[str, Any] = {"state": {KEY_PRIORITY: key_priority}}


def request(header: str | None = None, key_priority: str | None = None) -> ASGIConnection:
    return cast("ASGIConnection", _Fake(header, key_priority))


def test_the_header_then_the_models_file_then_normal() -> None:
    assert priority_of(request("Interactive "), "background") == "interactive"
    assert priority_of(request(), "background") == "background"
    assert priority_of(request()) == "normal"


def test_a_key_may_lower_its_priority_but_not_raise_it() -> None:
    assert priority_of(request("interactive", "background")) == "background"
    assert priority_of(request("background", "normal")) == "background"
    assert priority_of(request(None, "background"), "interactive") == "background"


def test_a_header_that_names_no_priority_is_a_400_naming_it() -> None:
    with pytest.raises(BadRequest, match="`GenieX-Priority` header: 'urgent' is not one of interactive, normal"):
        priority_of(request("urgent"))


def test_a_waiting_request_rises_a_class_per_aging_period() -> None:
    assert queue_rank("background", 0) == 2 and queue_rank("interactive", 0) == 0
    assert queue_rank("background", AGING_S) == queue_rank("normal", 0)
    # After twice the period a background request stands with a fresh interactive one: it is
    # first in line then, being older.
    assert queue_rank("background", 2 * AGING_S) == queue_rank("interactive", 0) == 0
