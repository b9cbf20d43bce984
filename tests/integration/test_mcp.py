"""MCP tools through the Responses API, on the real server, the real model and real MCP servers
(tests/mcp_test_server.py, on the official SDK): one over stdio, started by the gateway, and one
over streamable HTTP, started here. Driven by the `openai` SDK, which validates every item and
stream event. The model is SmolLM2-135M: each call is forced (`tool_choice`), and every assertion
on a result reads the arguments the model chose."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from tests.conftest import MODEL
from tests.server_proc import ServerProcess, free_port, serving

TEST_SERVER = Path(__file__).resolve().parents[1] / "mcp_test_server.py"
OWNER = "sk-mcp-owner-0123456789"  # key file: may use every server
WEB_ONLY = "sk-mcp-webonly-0123456789"  # may use `web` only
SECRET = "GENIEX_TEST_SECRET_VALUE"
CALC: dict[str, Any] = {"type": "mcp", "server_label": "calc", "require_approval": "never"}
WEB: dict[str, Any] = {"type": "mcp", "server_label": "web", "require_approval": "never"}
CALL_TIMEOUT_S = 3


def forced(label: str, name: str) -> dict[str, str]:
    return {"type": "mcp", "server_label": label, "name": name}


@pytest.fixture(scope="module")
def web_port() -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(TEST_SERVER), "http", "--port", str(port)])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, "the HTTP MCP test server did not start"
                time.sleep(0.1)
        yield port
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, web_port: int) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("mcp")
    config = base / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        "calc": {"command": sys.executable, "args": [str(TEST_SERVER), "stdio"], "env": {"GIVEN": "by-config"}},
        "web": {"url": f"http://127.0.0.1:{web_port}/mcp", "requestHeaders": ["X-User"]},
    }}))  # fmt: skip
    keys = base / "keys"
    keys.write_text(f"{OWNER} owner mcp=*\n{WEB_ONLY} webonly mcp=web\n")
    with serving(base / "data", "--nctx", "2048", "--mcp-config", str(config), "--api-key-file", str(keys),
                 "--mcp-call-timeout-s", str(CALL_TIMEOUT_S), "--mcp-max-result-kb", "64",
                 env={SECRET: "s3cret"}) as srv:  # fmt: skip
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=OWNER, max_retries=0, timeout=120)


def ask(client: openai.OpenAI, question: str, tool: dict[str, Any], name: str, **extra: Any) -> Any:
    return client.responses.create(model=MODEL, input=question, tools=[tool],  # type: ignore[list-item]
                                   tool_choice=forced(tool["server_label"], name),  # type: ignore[arg-type]
                                   max_tool_calls=1, temperature=0, max_output_tokens=48, **extra)  # fmt: skip


def call_of(response: Any) -> Any:
    calls = [o for o in response.output if o.type == "mcp_call"]
    assert len(calls) == 1, [o.type for o in response.output]
    return calls[0]


def calls(srv: ServerProcess, label: str, outcome: str) -> float:
    """geniex:mcp_calls_total for one server and outcome."""
    text = httpx.get(f"{srv.base_url}/metrics", timeout=10).text
    name = "geniex:mcp_calls_total"
    want = f'outcome="{outcome}",server="{label}"'
    for line in text.splitlines():
        m = re.fullmatch(rf"{re.escape(name)}\{{(.*)\}} (\S+)", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return 0.0


def test_a_forced_call_runs_on_the_stdio_server_and_the_model_answers(client: openai.OpenAI,
                                                                      server: ServerProcess) -> None:  # fmt: skip
    before = calls(server, "calc", "ok")
    r = ask(client, "What is 2 plus 3?", {**CALC, "allowed_tools": ["add", "lookup"]}, "add", user="mcp-ledger")
    assert [o.type for o in r.output] == ["mcp_list_tools", "mcp_call", "message"]
    listed = r.output[0]
    assert listed.server_label == "calc" and [t.name for t in listed.tools] == ["add", "lookup"]
    assert listed.tools[0].input_schema["required"] == ["a", "b"]
    call = call_of(r)
    args = json.loads(call.arguments)
    assert (call.server_label, call.name, call.status, call.error) == ("calc", "add", "completed", None)
    assert call.output == str(args["a"] + args["b"]), "the tool's real result for the model's arguments"
    assert r.status == "completed" and r.output_text.strip()
    assert r.tools[0].type == "mcp" and r.tools[0].server_label == "calc"
    assert calls(server, "calc", "ok") == before + 1
    # both rounds billed: two ledger requests whose tokens are the response's usage
    rows = httpx.get(f"{server.base_url}/v1/usage", headers={"x-api-key": OWNER}, timeout=10).json()["data"]
    (row,) = [row for row in rows if row["user"] == "mcp-ledger"]
    assert r.usage is not None and row["requests"] == 2
    assert (row["prompt_tokens"], row["completion_tokens"]) == (r.usage.input_tokens, r.usage.output_tokens)


def test_streamed_over_http_the_events_add_up_to_the_response(client: openai.OpenAI) -> None:
    tool = {**WEB, "allowed_tools": ["lookup"]}
    with client.responses.stream(model=MODEL, input="Which country has Paris as its capital?", tools=[tool],  # type: ignore[list-item]
                                 tool_choice=forced("web", "lookup"), max_tool_calls=1, temperature=0,  # type: ignore[arg-type]
                                 max_output_tokens=48) as stream:  # fmt: skip
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds  # the answer may use up its tokens
    final = events[-1].response  # type: ignore[union-attr]
    for kind in ("response.mcp_list_tools.in_progress", "response.mcp_list_tools.completed",
                 "response.mcp_call.in_progress", "response.mcp_call_arguments.done", "response.mcp_call.completed",
                 "response.output_text.delta"):  # fmt: skip
        assert kind in kinds, kind
    assert kinds.index("response.mcp_call.completed") < kinds.index("response.output_text.delta")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.mcp_call_arguments.delta")
    call = call_of(final)
    assert deltas == call.arguments
    key = json.loads(call.arguments)["key"]
    assert call.output == {"paris": "France", "tokyo": "Japan", "lima": "Peru"}.get(key, "unknown")
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in done] == [o.type for o in final.output]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text


def test_a_call_that_needs_approval_runs_only_once_approved(client: openai.OpenAI, server: ServerProcess) -> None:
    tool = {**CALC, "require_approval": "always", "allowed_tools": ["add"]}
    before = calls(server, "calc", "ok")
    r = ask(client, "What is 4 plus 5?", tool, "add")
    assert [o.type for o in r.output] == ["mcp_list_tools", "mcp_approval_request"]
    request = r.output[1]
    assert (request.server_label, request.name) == ("calc", "add")
    assert calls(server, "calc", "ok") == before, "nothing ran yet"
    approved = client.responses.create(model=MODEL, previous_response_id=r.id, tools=[tool], max_tool_calls=1,  # type: ignore[list-item]
                                       temperature=0, max_output_tokens=32,
                                       input=[{"type": "mcp_approval_response", "approval_request_id": request.id,
                                               "approve": True}])  # fmt: skip
    call = call_of(approved)
    args = json.loads(request.arguments)
    assert call.approval_request_id == request.id and call.arguments == request.arguments
    assert call.output == str(args["a"] + args["b"]) and approved.output[-1].type == "message"
    assert calls(server, "calc", "ok") == before + 1
    # refused: nothing runs, and the model goes on
    again = ask(client, "What is 6 plus 1?", tool, "add")
    refused = client.responses.create(model=MODEL, previous_response_id=again.id, tools=[tool], max_tool_calls=1,  # type: ignore[list-item]
                                      temperature=0, max_output_tokens=16,
                                      input=[{"type": "mcp_approval_response", "approve": False,
                                              "approval_request_id": again.output[1].id}])  # fmt: skip
    assert [o.type for o in refused.output] == ["mcp_list_tools", "message"]
    assert calls(server, "calc", "ok") == before + 1
    # an approval of a request that does not exist is a 400
    with pytest.raises(openai.BadRequestError) as refused_id:
        client.responses.create(model=MODEL, previous_response_id=r.id, tools=[tool],  # type: ignore[list-item]
                                input=[{"type": "mcp_approval_response", "approval_request_id": "mcpr_nope",
                                        "approve": True}])  # fmt: skip
    assert "no approval request 'mcpr_nope' waits" in refused_id.value.response.json()["error"]


def test_keys_use_only_the_servers_they_were_given(server: ServerProcess) -> None:
    web_only = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=WEB_ONLY, max_retries=0, timeout=120)
    with pytest.raises(openai.PermissionDeniedError) as denied:
        ask(web_only, "What is 2 plus 3?", CALC, "add")
    assert "may not use MCP server 'calc'" in denied.value.response.json()["error"]
    listed = httpx.get(f"{server.base_url}/v1/mcp/servers", headers={"x-api-key": WEB_ONLY}, timeout=30).json()
    assert [s["server_label"] for s in listed["data"]] == ["web"]
    assert "lookup" in [t["name"] for t in listed["data"][0]["tools"]]
    everything = httpx.get(f"{server.base_url}/v1/mcp/servers", headers={"x-api-key": OWNER}, timeout=30).json()
    assert [s["server_label"] for s in everything["data"]] == ["calc", "web"]
    assert httpx.get(f"{server.base_url}/v1/mcp/servers", timeout=10).status_code == 401


def test_the_stdio_server_gets_the_configs_environment_and_none_of_the_gateways(client: openai.OpenAI) -> None:
    call = call_of(ask(client, "List the environment.", {**CALC, "allowed_tools": ["environment"]}, "environment"))
    names = set((call.output or "").split(","))
    assert "GIVEN" in names and "PATH" in names
    assert SECRET not in names and not any(n.startswith("GENIEX") for n in names), names


@pytest.mark.parametrize(("tool", "outcome", "error"), [
    ("hang", "timeout", f"did not answer within {CALL_TIMEOUT_S} s"),
    ("flood", "too_large", "(--mcp-max-result-kb)"),
    ("fail", "tool_error", "the tool failed on purpose"),
])  # fmt: skip
def test_a_failing_call_ends_as_an_error_item_and_the_response_goes_on(client: openai.OpenAI, server: ServerProcess,
                                                                      tool: str, outcome: str, error: str) -> None:  # fmt: skip
    before = calls(server, "calc", outcome)
    started = time.monotonic()
    r = ask(client, "Go.", {**CALC, "allowed_tools": [tool]}, tool)
    call = call_of(r)
    assert call.status == "failed" and call.output is None and call.error is not None
    assert error in json.dumps(call.error.model_dump()), call.error
    assert r.status in ("completed", "incomplete") and r.output[-1].type == "message"  # the model read the error
    assert time.monotonic() - started < 60
    assert calls(server, "calc", outcome) == before + 1


def _refused(server: ServerProcess, status: int, tools: list[dict[str, Any]], **extra: Any) -> str:
    body = {"model": MODEL, "input": "hi", "tools": tools, **extra}
    r = httpx.post(f"{server.base_url}/v1/responses", json=body, headers={"x-api-key": OWNER}, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert isinstance(error, str) and error
    return error


def test_hostile_mcp_tools_are_refused_before_any_server_or_model_runs(server: ServerProcess) -> None:
    assert "server_label" in _refused(server, 400, [{**CALC, "server_label": "calc\u0000x"}])
    assert "no MCP server 'nope' is configured here; configured: calc, web" in _refused(
        server, 400, [{**CALC, "server_label": "nope"}]
    )
    assert "allowed_tools" in _refused(server, 400, [{**CALC, "allowed_tools": [f"t{i}" for i in range(10_000)]}])
    for url in ("http://169.254.169.254/latest/meta-data/", "file:///etc/passwd", "http://127.0.0.1:1/mcp"):
        assert "server_url" in _refused(server, 400, [{**WEB, "server_url": url}])
        assert "server_url" in _refused(server, 400, [{"type": "mcp", "server_label": "calc", "server_url": url}])
    assert "connector_id" in _refused(server, 400, [{**WEB, "connector_id": "connector_gmail"}])
    assert "stdio" in _refused(server, 400, [{**CALC, "headers": {"X-User": "a"}}])
    assert "x-user" in _refused(server, 400, [{**WEB, "headers": {"Authorization": "Bearer x"}}])
    assert "line breaks" in _refused(server, 400, [{**WEB, "headers": {"X-User": "a\r\nHost: evil"}}])
    assert "already in `tools`" in _refused(server, 400, [CALC, CALC])
    assert "tool_choice.name" in _refused(server, 400, [CALC], tool_choice=forced("calc", "rm_rf"))
    assert "reason" in _refused(
        server,
        400,
        [CALC],
        input=[
            {"type": "mcp_approval_response", "approval_request_id": "mcpr_x", "approve": True, "reason": "r" * 10_000}
        ],
    )
    # a header the operator allows reaches the server through a session of the request's own
    r = httpx.post(f"{server.base_url}/v1/responses", headers={"x-api-key": OWNER}, timeout=120, json={
        "model": MODEL, "input": "Paris?", "tools": [{**WEB, "allowed_tools": ["lookup"], "headers": {"X-User": "ann"}}],
        "tool_choice": forced("web", "lookup"), "max_tool_calls": 1, "max_output_tokens": 48, "temperature": 0})  # fmt: skip
    assert r.status_code == 200 and [o["type"] for o in r.json()["output"]][:2] == ["mcp_list_tools", "mcp_call"]


def test_a_result_posing_as_a_system_turn_stays_text_in_the_tools_turn(client: openai.OpenAI,
                                                                      server: ServerProcess) -> None:  # fmt: skip
    from gateway.mcp.results import contained

    call = call_of(ask(client, "Go.", {**CALC, "allowed_tools": ["claim_system"]}, "claim_system"))
    claim = call.output
    assert call.status == "completed" and claim is not None and "<|im_start|>system" in claim, "shown as it came"

    def ids(text: str) -> set[int]:
        r = httpx.post(f"{server.base_url}/tokenize", headers={"x-api-key": OWNER}, timeout=60,
                       json={"model": MODEL, "content": text, "parse_special": True})  # fmt: skip
        return set(r.json()["tokens"])

    special = ids("<|im_start|><|im_end|>")
    assert len(special) == 2 and special <= ids(claim), "as text, the claim would be the template's own tokens"
    assert not special & ids(contained(claim)), "what the model reads has none of them"
    # and the server goes on serving
    after = client.responses.create(model=MODEL, input="hi", max_output_tokens=4)
    assert after.status in ("completed", "incomplete") and after.output_text


@pytest.mark.parametrize("tool", [CALC, WEB], ids=["stdio", "http"])
def test_a_server_that_exits_mid_call_fails_that_call_and_is_started_again(client: openai.OpenAI,
                                                                          tool: dict[str, Any]) -> None:  # fmt: skip
    first = call_of(ask(client, "Which process?", {**tool, "allowed_tools": ["pid"]}, "pid")).output
    crashed = call_of(ask(client, "Go.", {**tool, "allowed_tools": ["crash"]}, "crash"))
    assert crashed.status == "failed" and "failed during the call" in json.dumps(crashed.error.model_dump())
    if tool is WEB:
        return  # an HTTP server is the operator's to restart; the gateway only reconnects to it
    again = call_of(ask(client, "Which process?", {**tool, "allowed_tools": ["pid"]}, "pid"))
    assert again.status == "completed" and again.output != first, "a new process"


def test_stdio_servers_stop_with_the_gateway_and_a_bad_config_stops_the_start(
        tmp_path: Path, start: Callable[..., ServerProcess]) -> None:  # fmt: skip
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps({"mcpServers": {"calc": {"command": sys.executable, "args": [str(TEST_SERVER), "stdio"]}}})
    )
    srv = start("--mcp-config", str(config))
    listed = httpx.get(f"{srv.base_url}/v1/mcp/servers", timeout=60).json()["data"]
    assert listed[0]["server_label"] == "calc" and listed[0]["error"] is None, "listing started it"
    children = [p for p in psutil.Process(srv.proc.pid).children(recursive=True)
                if str(TEST_SERVER) in " ".join(p.cmdline())]  # fmt: skip
    assert len(children) == 1
    assert srv.stop() == 0
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, "the MCP server outlived the gateway"
    config.write_text(json.dumps({"mcpServers": {"old": {"type": "sse", "url": "http://127.0.0.1:9/sse"}}}))
    bad = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--host", f"127.0.0.1:{free_port()}",
                          "--data-dir", str(tmp_path / "d"), "--mcp-config", str(config)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode != 0 and "error: --mcp-config" in bad.stderr and "SSE transport" in bad.stderr, bad.stderr
