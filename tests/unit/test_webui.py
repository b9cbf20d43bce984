"""The web UI's routes and /openapi.json, in-process: headers, keys, --no-webui, the schema's names.

The pages themselves are tested in a real browser (tests/browser)."""

from __future__ import annotations

import fnmatch
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from litestar.testing import TestClient

from gateway import cli
from gateway.app import create_app
from gateway.dialects.geniex.openapi import EXT, SPEC_FIELDS, document
from gateway.ops.settings import Settings
from gateway.web import routes
from tests.fuzz.spec import EARLIER, spec_dir

REPO = Path(__file__).resolve().parents[2]
HOST = {"host": "localhost"}
PAGES = ["/", "/voice", "/ops", "/try", "/docs"]


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient[Any]]:
    with TestClient(create_app(Settings(data_dir=tmp_path))) as c:
        yield c


def test_pages_and_assets_carry_a_csp_without_inline_scripts_or_other_origins(client: TestClient[Any]) -> None:
    for path in [*PAGES, "/static/app/chat.js", "/static/vendor/marked/marked.umd.js"]:
        r = client.get(path, headers=HOST)
        assert r.status_code == 200, path
        csp = r.headers["content-security-policy"]
        assert "script-src 'self';" in csp and "default-src 'none'" in csp and "connect-src 'self'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp and "http" not in csp
        assert r.headers["x-content-type-options"] == "nosniff"
    assert client.get("/", headers=HOST).headers["content-type"].startswith("text/html")


def test_pages_hold_no_inline_script_and_name_no_other_host() -> None:
    for page in routes.PAGES.glob("*.html"):
        html = page.read_text()
        assert "<script>" not in html and "javascript:" not in html and " on" + "click=" not in html, page
        assert "http://" not in html and "https://" not in html and "//cdn" not in html, page
    for script in (routes.STATIC / "app").glob("*.js"):
        assert "http://" not in script.read_text() and "https://" not in script.read_text(), script


def test_static_files_do_not_escape_their_folder(client: TestClient[Any]) -> None:
    for path in [
        "/static/../routes.py",
        "/static/%2e%2e/routes.py",
        "/static/..%2froutes.py",
        "/static/app/../../routes.py",
    ]:
        r = client.get(path, headers=HOST)
        assert r.status_code == 404, path
        assert "error" in r.json()


def test_with_api_keys_the_pages_load_and_the_api_still_needs_a_key(tmp_path: Path) -> None:
    with TestClient(create_app(Settings(data_dir=tmp_path, api_keys=["sekrit"]))) as c:
        for path in [*PAGES, "/openapi.json", "/static/app/common.js"]:
            assert c.get(path, headers=HOST).status_code == 200, path
        assert c.get("/v1/models", headers=HOST).status_code == 401
        assert c.get("/v1/workers", headers=HOST).status_code == 401
        assert c.get("/v1/models", headers={**HOST, "authorization": "Bearer sekrit"}).status_code == 200
        assert c.get("/v1/usage", headers=HOST).status_code == 401


def test_no_webui_serves_none_of_it(tmp_path: Path) -> None:
    with TestClient(create_app(Settings(data_dir=tmp_path, webui=False))) as c:
        for path in [*PAGES, "/openapi.json", "/static/app/chat.js"]:
            r = c.get(path, headers=HOST)
            assert r.status_code == 404, path
            assert "content-security-policy" not in r.headers
        assert c.get("/v1/models", headers=HOST).status_code == 200


def test_no_webui_flag_and_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli.serve_parser().parse_args([]).webui is True
    assert cli.serve_parser().parse_args(["--no-webui"]).webui is False
    for raw, expected in (("1", False), ("true", False), ("0", True), ("no", True)):
        monkeypatch.setenv("GENIEX_NO_WEBUI", raw)
        p = cli.serve_parser()
        cli._env_defaults(p)
        assert p.parse_args([]).webui is expected, raw


def test_a_form_from_the_servers_own_page_passes_and_from_another_site_does_not(client: TestClient[Any]) -> None:
    files = {"file": ("a.wav", b"RIFF0000WAVE", "audio/wav")}
    data = {"model": "no/such-model"}
    own = client.post(
        "/v1/audio/transcriptions", headers={**HOST, "origin": "http://localhost"}, files=files, data=data
    )
    assert own.status_code != 403, own.text  # past the guard: the handler answers (no such model)
    other = client.post(
        "/v1/audio/transcriptions", headers={**HOST, "origin": "http://evil.example"}, files=files, data=data
    )
    assert other.status_code == 403


def test_with_any_host_allowed_a_form_needs_an_allowed_origin_even_from_its_own_host(tmp_path: Path) -> None:
    # `--allowed-host '*'` turns the Host check off, so a rebinding page's Host would match its Origin.
    files = {"file": ("a.wav", b"RIFF0000WAVE", "audio/wav")}
    with TestClient(create_app(Settings(data_dir=tmp_path, allowed_hosts=["*"]))) as c:
        r = c.post("/v1/audio/transcriptions", headers={"host": "evil.example", "origin": "http://evil.example"},
                   files=files, data={"model": "x"})  # fmt: skip
    assert r.status_code == 403


def test_every_web_asset_is_package_data() -> None:
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["gateway.web"]
    root = routes.HERE
    for f in root.rglob("*"):
        if f.is_dir() or f.suffix in (".py", ".pyc") or "__pycache__" in f.parts:
            continue
        rel = f.relative_to(root).parts
        matched = any(
            len(p.split("/")) == len(rel) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(rel, p.split("/")))
            for p in patterns
        )
        assert matched, f"{f.relative_to(root)} would be left out of the wheel"


def test_vendored_libraries_keep_their_licences() -> None:
    vendor = routes.STATIC / "vendor"
    notes = (vendor / "VENDORED.md").read_text()
    for folder in (p for p in vendor.iterdir() if p.is_dir()):
        assert (folder / "LICENSE").is_file(), folder
        assert f"`{folder.name}/`" in notes, folder


# --- /openapi.json --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return json.loads(document())


def _spec() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((spec_dir() / "openapi-current.yaml").read_text())
    earlier = yaml.safe_load(EARLIER.read_text())
    spec["paths"].update(earlier["paths"])
    spec["components"]["schemas"].update(earlier["components"]["schemas"])
    return spec


def test_the_spec_field_table_is_the_spec() -> None:
    spec = _spec()
    written = {name: frozenset(s.get("properties", {})) for name, s in spec["components"]["schemas"].items()}
    # The newest reference page adds max_tokens and reasoning_format to the chat request.
    expected = dict(SPEC_FIELDS)
    expected["ChatCompletionRequest"] = expected["ChatCompletionRequest"] - {"max_tokens", "reasoning_format"}
    assert written == expected


def test_the_schema_uses_the_specs_names_and_fields(schema: dict[str, Any]) -> None:
    spec = _spec()
    ours = schema["components"]["schemas"]
    for name, fields in SPEC_FIELDS.items():
        assert name in ours, name
        props = ours[name].get("properties") or ours[ours[name]["$ref"].rsplit("/", 1)[1]]["properties"]
        assert fields <= set(props) | ({"created", "object", "permission"} if name == "Model" else set()), name
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            assert schema["paths"][path][method]["operationId"] == op["operationId"], path
            assert EXT not in schema["paths"][path][method], path
    assert all("." not in name for name in ours)
    assert all(s.get("title", name) == name for name, s in ours.items())


def test_extensions_are_marked(schema: dict[str, Any]) -> None:
    ours = schema["components"]["schemas"]
    chat = ours["ChatCompletionRequest"]["properties"]
    assert chat["n"][EXT] is True and chat["keep_alive"][EXT] is True
    assert EXT not in chat["nctx"] and EXT not in chat["messages"]
    assert ours["WorkerTable"][EXT] is True
    assert schema["paths"]["/v1/completions"]["post"][EXT] is True
    assert schema["paths"]["/v1/completions"]["post"]["tags"] == ["GenieX extensions"]


def test_every_reference_resolves_and_every_route_is_documented(schema: dict[str, Any], tmp_path: Path) -> None:
    names = set(schema["components"]["schemas"])
    refs = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.add(node["$ref"].rsplit("/", 1)[1])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    assert refs <= names, refs - names
    app = create_app(Settings(data_dir=tmp_path))
    served = {(m.lower(), r.path.replace("{model_id:path}", "{model}").replace(":str}", "}"))
              for r in app.routes for m in getattr(r, "methods", set()) if m not in ("OPTIONS", "HEAD")}  # fmt: skip
    web = {p for _, p in served if p in routes.PAGE_PATHS or p.startswith("/static")} | {"/v1", "/openapi.json"}
    documented = {(m, p) for p, ops in schema["paths"].items() for m in ops}
    assert {(m, p) for m, p in served if p not in web} == documented
