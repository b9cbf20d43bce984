"""Who may manage models (pull, delete, copy): keys from --api-key do, key-file keys with `manage=yes`,
everyone on a server without keys; `require_manage` says 403 to the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar, Request, post
from litestar.testing import TestClient

from gateway.app import _on_genie_error
from gateway.errors import GenieXError
from gateway.http.auth import ApiKeyAuth, require_manage
from gateway.ops.keys import KeyFileError, KeyRing, parse_key_file, parse_key_lines
from gateway.ops.limits import KeyLimiter, Limits

FLAG, ADMIN, USER = "sk-flag-0123456789", "sk-admin-0123456789", "sk-user-0123456789"


def test_the_key_file_takes_manage_beside_the_limits() -> None:
    lines = parse_key_lines(f"{ADMIN} admin manage=yes rpm=5\n{USER} user\nsk-x-0123456789 manage=no\n")
    assert [(k.label, k.manage, k.limits) for k in lines[:2]] == [
        ("admin", True, Limits(rpm=5)),
        ("user", False, Limits()),
    ]
    assert lines[2].label.startswith("key-") and not lines[2].manage
    assert parse_key_file(f"{ADMIN} admin manage=yes rpm=5")[0][1:] == ("admin", Limits(rpm=5))
    for bad in ("manage=maybe", "admin manage", "admin=yes"):
        with pytest.raises(KeyFileError, match="line 1"):
            parse_key_lines(f"{ADMIN} {bad}")


def test_flag_keys_manage_and_file_keys_only_when_marked(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text(f"{ADMIN} admin manage=yes\n{USER} user\n")
    ring = KeyRing([FLAG], f)
    assert {k.label: k.manage for k in ring.keys} == {ring.keys[0].label: True, "admin": True, "user": False}


@post("/pull", status_code=200)
async def pull_route(request: Request) -> dict[str, bool]:
    require_manage(request, "pull models")
    return {"ok": True}


def client(keys: KeyRing) -> TestClient[Any]:
    from litestar.middleware import DefineMiddleware

    app = Litestar([pull_route], middleware=[DefineMiddleware(ApiKeyAuth, keys=keys, limiter=KeyLimiter())],
                   exception_handlers={GenieXError: _on_genie_error})  # fmt: skip
    return TestClient(app)


def test_require_manage_refuses_a_key_without_the_right(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text(f"{ADMIN} admin manage=yes\n{USER} user\n")
    with client(KeyRing([FLAG], f)) as c:
        for key in (FLAG, ADMIN):
            assert c.post("/pull", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        r = c.post("/pull", headers={"x-api-key": USER})
        assert r.status_code == 403
        message = r.json()["error"]
        assert "(user) may not pull models" in message and "manage=yes" in message and USER not in message
        assert c.post("/pull").status_code == 401


def test_without_keys_everyone_may() -> None:
    with client(KeyRing([])) as c:
        assert c.post("/pull").status_code == 200
