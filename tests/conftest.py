from __future__ import annotations

import ast
import functools
import gc
import json
import sys
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.server_proc import STARTED, ServerProcess, serving

# CPython 3.11 before 3.11.8 (and 3.12 before 3.12.2) keeps ast.parse's recursion count in one
# shared place (python/cpython#106905). A parse that a finalizer starts while another parse builds
# its tree throws that count off, and the outer parse fails: `SystemError: AST constructor recursion
# depth mismatch`. A failing test sets this up: the asyncio tasks it leaves behind, their errors
# never retrieved, sit in reference cycles until a garbage collection frees them, and asyncio then
# logs each error with its traceback, which 3.11's traceback module parses for its ^^^ markers.
# Pytest parses when it renders that test's failure (the module's source) and when it imports a
# plugin's module late (assertion rewriting: schemathesis's report writers at session end, afresh
# on every run under PYTHONDONTWRITEBYTECODE), so the collection can fall inside a parse, and the
# report is lost to an INTERNALERROR or a crash. tests/unit/test_failure_reports.py shows it. The
# fix: no garbage collection during a parse, so no finalizer runs inside one. Every pytest run
# loads this file (`make test`, its xdist workers, a single module) before any test runs.
AST_RECURSION_BUG = (3, 11) <= sys.version_info < (3, 11, 8) or (3, 12) <= sys.version_info < (3, 12, 2)


def _parse_without_collections(parse: Any) -> Any:
    @functools.wraps(parse)
    def parse_without_collections(*args: Any, **kwargs: Any) -> Any:
        if not gc.isenabled():
            return parse(*args, **kwargs)
        gc.disable()
        try:
            return parse(*args, **kwargs)
        finally:
            gc.enable()

    parse_without_collections.collections_paused = True  # type: ignore[attr-defined]
    return parse_without_collections


if AST_RECURSION_BUG and not getattr(ast.parse, "collections_paused", False):
    ast.parse = _parse_without_collections(ast.parse)

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1"


def _share_the_default_ssl_context() -> None:
    """httpx makes an SSLContext (certifi's roots parsed anew) for every client, so for every
    httpx.get or httpx.post and every SDK client: about 27 ms of CPU each, thousands of times a run,
    mostly for servers that speak plain HTTP. One default context serves every client of this
    process (a context may be shared); a test's own (`verify=ctx`, a client certificate) is its own."""
    try:
        from httpx._transports import default
    except ImportError:  # httpx moved it: every client builds its own again, slower but the same
        return
    make = default.create_ssl_context
    shared = functools.cache(lambda trust_env: make(verify=True, cert=None, trust_env=trust_env))

    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
        if verify is True and cert is None:
            return shared(trust_env)
        return make(verify=verify, cert=cert, trust_env=trust_env)

    default.create_ssl_context = create_ssl_context


_share_the_default_ssl_context()

# `make test` runs the suite on two pytest-xdist workers (-n 2 --dist loadgroup). A module is one
# group, so that its server fixture starts once; the modules that share the converted NPU graphs
# (tests/npu_models.converted and converted_parts, about 7 s each) are one group; and the slowest
# groups are handed out first, so that neither worker is left alone with a long one at the end.
# test_npu_chat compiles its own bundle (a 2-layer SmolLM2, under a minute in the simulator), so it
# runs beside the "npu" group, not in it.
SHARED_GROUPS = dict.fromkeys(
    ("test_npu_convert", "test_npu_engine", "test_npu_cache", "test_npu_parts", "test_npu_iobinding"), "npu"
)
SLOWEST_FIRST = (  # summed seconds in a full run on the 2-core AVX2 VM, 2026-12-06
    "npu",  # ~140
    "test_agent_clis",  # 97
    "test_npu_chat",  # ~90
    "test_lifecycle",  # 90
    "test_gpu",  # 69
    "test_browser_mcp",  # 60
    "test_ollama",  # 52
    "test_speculative",  # 51
    "test_fuzz",  # 49
    "test_mcp",  # 49
    "test_soak",  # 48
    "test_disk_cache",  # 46
    "test_npu_archs",  # 41
    "test_keepalive",  # ~40
    "test_responses",  # 40
    "test_chat_features",  # 40
    "test_prompt_cache",  # 39
    "test_pull",  # 39
)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def group(item: pytest.Item) -> str:
        return SHARED_GROUPS.get(item.path.stem, item.nodeid.split("::")[0])

    for item in items:
        item.add_marker(pytest.mark.xdist_group(group(item)))

    def rank(item: pytest.Item) -> int:
        name = SHARED_GROUPS.get(item.path.stem, item.path.stem)
        return SLOWEST_FIRST.index(name) if name in SLOWEST_FIRST else len(SLOWEST_FIRST)

    items.sort(key=rank)  # stable: each module's own order is kept


_SESSION_START = time.time()
_LOG_OFFSETS = pytest.StashKey[dict[int, int]]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_LOG_OFFSETS] = {id(srv): srv.log_size() for srv in STARTED}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report carries what each server logged while it ran: the logs live in
    pytest's temp dirs, of which only the last three runs are kept, so they are often gone by the
    time anyone looks."""
    report: pytest.TestReport = yield
    if report.failed:
        offsets = item.stash.get(_LOG_OFFSETS, {})
        for srv in STARTED:
            start = offsets.get(id(srv), 0)
            if srv.log_size() > start:
                report.sections.append((f"server log ({srv.base_url}, {srv.log_path})", srv.log_since(start)))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The agent CLIs' versions this run tested against (tests/integration/test_agent_clis.py)."""
    from tests import agent_clis

    try:
        record = json.loads(agent_clis.VERSIONS.read_text())
    except (OSError, ValueError):
        return
    if record.get("at", 0) >= _SESSION_START:
        versions = ", ".join(f"{name} {version}" for name, version in record["versions"].items())
        terminalreporter.write_line(f"agent CLIs tested: {versions}")


# A tool's JSON schema the dialect tests share: small enough that a 135M model, forced to call
# it, always fills it in validly.
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}


YES_NO = 'root ::= "yes" | "no"\n'


@pytest.fixture(scope="session")
def grammar_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(allowed, outside): the server may read GBNF files from `allowed` only.

    `allowed` holds yesno.gbnf and a symlink escaping to `outside`, which holds secret.gbnf.
    """
    base = tmp_path_factory.mktemp("grammars")
    allowed, outside = base / "allowed", base / "outside"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "yesno.gbnf").write_text(YES_NO)
    (outside / "secret.gbnf").write_text(YES_NO)
    (allowed / "escape.gbnf").symlink_to(outside / "secret.gbnf")
    return allowed, outside


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, grammar_dirs: tuple[Path, Path]) -> Iterator[ServerProcess]:
    """One real server for the read-mostly tests; tests that kill or reconfigure start their own."""
    # --qnn-simulator: `compute: npu` (OCR) runs on QNN's HTP simulator, as on a Snapdragon's NPU.
    with serving(tmp_path_factory.mktemp("data"), "--nctx", "2048", "--grammar-dir", str(grammar_dirs[0]),
                 "--qnn-simulator") as srv:  # fmt: skip
        yield srv


@pytest.fixture(scope="session")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"
