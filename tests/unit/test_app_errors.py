"""The app's error mapping: an unexpected exception is a 500 that names the request, not the bug."""

from __future__ import annotations

from pathlib import Path

import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.models.store import ModelStore
from gateway.ops.settings import Settings


def test_an_unexpected_exception_is_a_500_without_its_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: ModelStore) -> list[object]:
        raise RuntimeError("secret internals /etc/passwd")

    with TestClient(create_app(Settings(data_dir=tmp_path))) as client:
        monkeypatch.setattr(ModelStore, "entries", broken)
        r = client.get("/v1/models", headers={"x-request-id": "req-test-500", "host": "localhost"})
    assert r.status_code == 500
    assert r.json() == {"error": "internal error; the server log has the details under this request id",
                        "request_id": "req-test-500"}  # fmt: skip
