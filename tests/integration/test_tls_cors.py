"""HTTPS with the operator's certificate, and CORS for the operator's origins only."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import MODEL
from tests.server_proc import free_port

KEY = "sk-web-0123456789abcdef"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)  # fmt: skip
    return cert, key


def test_https_with_the_operators_certificate(start, certificate: tuple[Path, Path]) -> None:  # type: ignore[no-untyped-def]
    cert, key = certificate
    srv = start("--nctx", "1024", "--certfile", str(cert), "--keyfile", str(key))
    assert srv.base_url.startswith("https://")
    client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="x", http_client=httpx.Client(verify=srv.verify))
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert r.choices[0].message.content is not None
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{srv.port}/health", timeout=5)  # no plain HTTP beside it
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{srv.base_url}/health", timeout=5)  # an unknown certificate is refused by default
    assert "https://" in srv.log()


def test_a_certificate_that_does_not_load_is_one_line_at_start(tmp_path: Path, certificate: tuple[Path, Path]) -> None:
    cert, _ = certificate
    for args, says in ((["--certfile", str(cert)], "both --certfile and --keyfile"),
                       (["--certfile", str(cert), "--keyfile", str(tmp_path / "missing.pem")], "--keyfile")):  # fmt: skip
        p = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--host", f"127.0.0.1:{free_port()}",
                            "--data-dir", str(tmp_path), *args], capture_output=True, text=True, timeout=60)  # fmt: skip
        assert p.returncode == 1 and says in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_cors_answers_the_operators_origins_only(start) -> None:  # type: ignore[no-untyped-def]
    srv = start("--nctx", "1024", "--origins", "http://app.example", "--api-key", KEY)
    url = f"{srv.base_url}/v1/chat/completions"
    asks = {"access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type, geniex-keepcache, x-stainless-os"}  # fmt: skip
    ok = httpx.options(url, headers={"origin": "http://app.example", **asks}, timeout=10)
    assert ok.status_code == 204, ok.text
    assert ok.headers["access-control-allow-origin"] == "http://app.example"
    allowed = {h.strip() for h in ok.headers["access-control-allow-headers"].lower().split(",")}
    assert {"authorization", "content-type", "geniex-keepcache", "x-stainless-os"} <= allowed
    assert "POST" in ok.headers["access-control-allow-methods"]
    foreign = httpx.options(url, headers={"origin": "http://evil.example", **asks}, timeout=10)
    assert foreign.status_code >= 400 and "access-control-allow-origin" not in foreign.headers
    # the real request from the allowed origin may read its answer and the headers it needs
    r = httpx.post(url, headers={"origin": "http://app.example", "authorization": f"Bearer {KEY}"}, timeout=60,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})  # fmt: skip
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.example"
    assert "x-request-id" in r.headers["access-control-expose-headers"].lower()
    # no origins configured: no CORS headers at all, so a page on another origin cannot read answers
    plain = start("--nctx", "1024")
    r = httpx.options(f"{plain.base_url}/v1/models", headers={"origin": "http://app.example", **asks}, timeout=10)
    assert "access-control-allow-origin" not in r.headers
