"""One MCP round run by the server (`/v1/responses` with an `mcp` tool) against the same round
trip run by the client (a function tool, the call made through the official `mcp` SDK, the result
sent back in a second request), in the same run, on the same server, greedy.

    .venv/bin/python bench/mcp.py [--reps 20] [--max-output-tokens 64] [--busy 1] [--no-http]

The MCP server is tests/mcp_test_server.py's `add`, over stdio (the gateway starts it from
`--mcp-config`; the client starts its own copy) and over streamable HTTP (one process that both
reach). Each round asks SmolLM2 "What is 2 plus 3?" with the tool forced and `max_tool_calls` 1:

- `server`: one `responses.create` with `{type: "mcp", server_label, allowed_tools: ["add"],
  require_approval: "never"}` and `tool_choice: {type: "mcp", ...}`: two model turns and the
  call, all in the server.
- `client`: the same with a plain function tool `add` (the MCP tool's description and input
  schema, as `list_tools` gives them), forced; the client runs the call through one `mcp.Client`
  session kept open for the whole run (as an agent would), and sends its `function_call_output`
  in a second `responses.create` (`previous_response_id`, `tool_choice: "none"`: the server's own
  second turn is offered no tools once `max_tool_calls` have run, so it renders no tools either).
- `client-ns`: the client's round trip again, the function in a `namespace` tool named as the
  server label with description "MCP server LABEL": the model then sees `LABEL.add`, "(MCP server
  LABEL) Add two integers.", exactly what the server offers for the MCP tool, so the two prompts
  and generations are token for token the same, and the ratio is the MCP machinery alone. The
  plain `add` of `client` is a different prompt (and the model writes a shorter name in its call).

Every turn is capped at `--max-output-tokens` (the server applies `max_output_tokens` to each of
its turns). Rounds alternate the variants (the order reverses every round) after a warm-up, so
drift in the machine's load hits all alike. Per variant it reports the median and p90 wall time
of the whole round, the ratio of the server's to each client baseline (medians, and the median
of per-round ratios), the tokens (input and output, summed over both turns) and the answer text
of every round, checked equal where they should be. The tool's own time: the server's
(`geniex:mcp_call_seconds` on /metrics, read between rounds, also checked against the `MCP call`
log lines) against the client's `call_tool` time. With `--busy N` (default 1) it all runs again
with N spinning processes beside the server (bench/contention.py's neighbour).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder comes first on the path, and this file would shadow the SDK.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx
import openai

from bench.contention import Hogs
from bench.launcher import Server, free_port
from bench.stats import pct

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1"
QUESTION = "What is 2 plus 3?"
TOOL = "add"
TEST_SERVER = REPO / "tests" / "mcp_test_server.py"
LABELS = {"stdio": "calc", "http": "calc_http"}

Result = dict[str, Any]
Variant = Callable[[], Awaitable[Result]]


@contextlib.asynccontextmanager
async def http_mcp_server() -> AsyncIterator[str]:
    """tests/mcp_test_server.py over streamable HTTP; its URL once the port accepts."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(TEST_SERVER), "http", "--port", str(port)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the HTTP MCP server did not start (exit {proc.poll()})") from None
                await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def mcp_seconds(metrics: str, label: str) -> tuple[float, int]:
    """`geniex:mcp_call_seconds` of one server on /metrics: (sum, count)."""
    got = {}
    for kind in ("sum", "count"):
        m = re.search(rf'^geniex:mcp_call_seconds_{kind}\{{[^}}]*server="{re.escape(label)}"[^}}]*\}} (\S+)$',
                      metrics, re.M)  # fmt: skip
        got[kind] = float(m.group(1)) if m else 0.0
    return got["sum"], int(got["count"])


def usage_of(resp: Any) -> tuple[int, int, int]:
    """(input, output, cached input) tokens."""
    u = resp.usage
    if u is None:
        return 0, 0, 0
    return u.input_tokens, u.output_tokens, u.input_tokens_details.cached_tokens if u.input_tokens_details else 0


def server_variant(oa: openai.AsyncOpenAI, http: httpx.AsyncClient, base: str, label: str, cap: int) -> Variant:
    body: dict[str, Any] = {
        "model": MODEL, "input": QUESTION, "temperature": 0, "max_output_tokens": cap, "max_tool_calls": 1,
        "tools": [{"type": "mcp", "server_label": label, "allowed_tools": [TOOL], "require_approval": "never"}],
        "tool_choice": {"type": "mcp", "server_label": label, "name": TOOL},
    }  # fmt: skip

    async def run() -> Result:
        before = mcp_seconds((await http.get(f"{base}/metrics")).text, label)
        t0 = time.perf_counter()
        resp = await oa.responses.create(**body)
        wall = time.perf_counter() - t0
        after = mcp_seconds((await http.get(f"{base}/metrics")).text, label)
        calls = [o for o in resp.output if o.type == "mcp_call"]
        listed = [o for o in resp.output if o.type == "mcp_list_tools"]
        inp, out, cached = usage_of(resp)
        problems = []
        if len(calls) != 1 or calls[0].error is not None or calls[0].status != "completed":
            problems.append(f"mcp_call items: {[c.model_dump(exclude_none=True) for c in calls]}")
        if len(listed) != 1:
            problems.append(f"{len(listed)} mcp_list_tools items")
        if after[1] - before[1] != 1:
            problems.append(f"{after[1] - before[1]} calls counted on /metrics")
        return {"wall_s": wall, "tool_s": after[0] - before[0], "input_tokens": inp, "output_tokens": out,
                "cached_tokens": cached, "text": resp.output_text, "arguments": calls[0].arguments if calls else None,
                "tool_output": calls[0].output if calls else None, "status": resp.status,
                "problems": problems}  # fmt: skip

    return run


def client_variant(oa: openai.AsyncOpenAI, session: Any, tool: Any, label: str | None, cap: int) -> Variant:
    """`label` None: a plain function `add`; else the function in a namespace named `label`."""
    fn: dict[str, Any] = {"type": "function", "name": tool.name, "description": tool.description,
                          "parameters": tool.input_schema}  # fmt: skip
    if label is None:
        tools = [fn]
        choice: dict[str, Any] = {"type": "function", "name": tool.name}
    else:
        tools = [{"type": "namespace", "name": label, "description": f"MCP server {label}", "tools": [fn]}]
        choice = {"type": "function", "name": tool.name, "namespace": label}
    first: dict[str, Any] = {"model": MODEL, "input": QUESTION, "temperature": 0, "max_output_tokens": cap,
                             "tools": tools, "tool_choice": choice}  # fmt: skip

    async def run() -> Result:
        t0 = time.perf_counter()
        resp = await oa.responses.create(**first)
        calls = [o for o in resp.output if o.type == "function_call"]
        problems = [] if len(calls) == 1 else [f"{len(calls)} function calls in the first turn"]
        if not calls:
            return {"wall_s": time.perf_counter() - t0, "problems": problems}
        call = calls[0]
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            return {"wall_s": time.perf_counter() - t0, "problems": [f"arguments cut or malformed: {call.arguments}"]}
        t1 = time.perf_counter()
        result = await session.call_tool(call.name, arguments)
        t2 = time.perf_counter()
        tool_s = t2 - t1
        text = "\n".join(b.text for b in result.content if getattr(b, "type", "") == "text")
        if not text and result.structured_content is not None:
            text = json.dumps(result.structured_content, ensure_ascii=False)
        if result.is_error:
            problems.append(f"the tool failed: {text}")
        second: dict[str, Any] = {"model": MODEL, "previous_response_id": resp.id, "temperature": 0,
                                  "max_output_tokens": cap, "tools": tools, "tool_choice": "none",
                                  "input": [{"type": "function_call_output", "call_id": call.call_id, "output": text}]}  # fmt: skip
        resp2 = await oa.responses.create(**second)
        t3 = time.perf_counter()
        wall = t3 - t0
        (i1, o1, c1), (i2, o2, c2) = usage_of(resp), usage_of(resp2)
        return {"wall_s": wall, "tool_s": tool_s, "input_tokens": i1 + i2, "output_tokens": o1 + o2,
                "cached_tokens": c1 + c2, "text": resp2.output_text, "arguments": call.arguments,
                "tool_output": text, "status": resp2.status, "turn1_s": t1 - t0, "turn2_s": t3 - t2,
                "problems": problems}  # fmt: skip

    return run


async def measure(variants: dict[str, Variant], reps: int, warmup: int) -> dict[str, list[Result]]:
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            await variants[name]()
    got: dict[str, list[Result]] = {n: [] for n in names}
    for i in range(reps):
        for name in names if i % 2 == 0 else names[::-1]:
            got[name].append(await variants[name]())
    return got


def _ms(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return round(statistics.median(xs) * 1000, 1) if xs else None


def summarise(got: dict[str, list[Result]], pairs: list[tuple[str, str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, rounds in got.items():
        walls = [r["wall_s"] for r in rounds]
        tools = [r["tool_s"] for r in rounds if "tool_s" in r]
        out[name] = {
            "median_ms": round(statistics.median(walls) * 1000, 1), "p90_ms": round((pct(walls, 90) or 0.0) * 1000, 1),
            "tool_median_ms": round(statistics.median(tools) * 1000, 2) if tools else None,
            "tool_p90_ms": round((pct(tools, 90) or 0.0) * 1000, 2) if tools else None,
            "output_tokens": sorted({r.get("output_tokens") for r in rounds}, key=str),
            "input_tokens": sorted({r.get("input_tokens") for r in rounds}, key=str),
            "turn1_median_ms": _ms(r.get("turn1_s") for r in rounds),
            "turn2_median_ms": _ms(r.get("turn2_s") for r in rounds),
            "cached_tokens_median": statistics.median(r.get("cached_tokens", 0) for r in rounds),
            "texts": sorted({r.get("text") for r in rounds}, key=str),
            "arguments": sorted({r.get("arguments") for r in rounds}, key=str),
            "tool_outputs": sorted({r.get("tool_output") for r in rounds}, key=str),
            "statuses": sorted({r.get("status") for r in rounds}, key=str),
            "problems": [p for r in rounds for p in r["problems"]],
            "all_ms": [round(w * 1000, 1) for w in walls],
        }  # fmt: skip
    for srv, cli in pairs:
        a, b = got[srv], got[cli]
        paired = [x["wall_s"] / y["wall_s"] for x, y in zip(a, b, strict=True)]
        same = out[srv]["output_tokens"] == out[cli]["output_tokens"] and out[srv]["texts"] == out[cli]["texts"]
        out[f"{srv} / {cli}"] = {
            "ratio_of_medians": round(out[srv]["median_ms"] / out[cli]["median_ms"], 3),
            "median_paired_ratio": round(statistics.median(paired), 3),
            "difference_ms": round(out[srv]["median_ms"] - out[cli]["median_ms"], 1),
            "same_tokens_and_text": same,
            "same_input_tokens": out[srv]["input_tokens"] == out[cli]["input_tokens"],
        }  # fmt: skip
    return out


def report(phase: str, s: dict[str, Any], pairs: list[tuple[str, str]]) -> None:
    print(f"--- {phase}")
    print(f"{'variant':16s} {'median ms':>9s} {'p90 ms':>8s} {'tool ms':>8s} {'tool p90':>8s} {'turns ms':>13s} "
          "tokens in (cached)/out  answer")  # fmt: skip
    for name, v in s.items():
        if " / " in name:
            continue
        tool = f"{v['tool_median_ms']:8.2f} {v['tool_p90_ms']:8.2f}" if v["tool_median_ms"] is not None else " " * 17
        turns = f"{v['turn1_median_ms']:6.0f} {v['turn2_median_ms']:6.0f}" if v["turn1_median_ms"] else " " * 13
        print(f"{name:16s} {v['median_ms']:9.1f} {v['p90_ms']:8.1f} {tool} {turns} {v['input_tokens']} "
              f"({v['cached_tokens_median']:g})/{v['output_tokens']}  {v['texts']!r}")  # fmt: skip
        for p in sorted(set(v["problems"])):
            print(f"    PROBLEM: {p}")
    for srv, cli in pairs:
        r = s[f"{srv} / {cli}"]
        note = "same tokens and text" if r["same_tokens_and_text"] else "NOT the same tokens or text"
        note += ", same prompt tokens" if r["same_input_tokens"] else ", other prompt tokens"
        print(f"{srv} / {cli}: {r['ratio_of_medians']:.3f} (medians), {r['median_paired_ratio']:.3f} (paired), "
              f"{r['difference_ms']:+.1f} ms; {note}")  # fmt: skip


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from mcp import Client, StdioServerParameters

    tmp = Path(tempfile.mkdtemp(prefix="geniex-bench-mcp-"))
    async with contextlib.AsyncExitStack() as stack:
        servers: dict[str, Any] = {LABELS["stdio"]: {"command": sys.executable, "args": [str(TEST_SERVER), "stdio"]}}
        url = None
        if args.http:
            url = await stack.enter_async_context(http_mcp_server())
            servers[LABELS["http"]] = {"url": url}
        config = tmp / "mcp.json"
        config.write_text(json.dumps({"mcpServers": servers}))
        srv = Server(tmp / "data", "--mcp-config", str(config), *args.server_arg)
        stack.callback(srv.stop)
        srv.wait_ready()
        oa = openai.AsyncOpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=30))
        sessions = {"stdio": await stack.enter_async_context(Client(StdioServerParameters(
            command=sys.executable, args=[str(TEST_SERVER), "stdio"])))}  # fmt: skip
        if url is not None:
            sessions["http"] = await stack.enter_async_context(Client(url))
        variants: dict[str, Variant] = {}
        pairs: list[tuple[str, str]] = []
        for transport, session in sessions.items():
            label = LABELS[transport]
            tool = next(t for t in (await session.list_tools()).tools if t.name == TOOL)
            variants[f"server-{transport}"] = server_variant(oa, http, srv.base_url, label, args.max_output_tokens)
            variants[f"client-{transport}"] = client_variant(oa, session, tool, None, args.max_output_tokens)
            variants[f"client-ns-{transport}"] = client_variant(oa, session, tool, label, args.max_output_tokens)
            pairs += [(f"server-{transport}", f"client-{transport}"), (f"server-{transport}", f"client-ns-{transport}")]
        out: dict[str, Any] = {}
        phases = [("idle", 0)] + ([(f"busy {args.busy}", args.busy)] if args.busy else [])
        for i, (phase, hogs) in enumerate(phases):
            with Hogs(hogs):
                got = await measure(variants, args.reps, args.warmup if i == 0 else 1)
            out[phase] = summarise(got, pairs)
            report(phase, out[phase], pairs)
        logged = [e for e in srv.events() if e.get("event") == "MCP call"]
        out["log"] = {"calls": len(logged), "outcomes": sorted({str(e.get("outcome")) for e in logged}),
                      "seconds_median_ms": round(statistics.median(float(e["seconds"]) for e in logged) * 1000, 1)
                      if logged else None,
                      "warnings": [e for e in srv.events() if e.get("level") in ("warning", "error")][:20]}  # fmt: skip
        print(f"server log: {out['log']['calls']} `MCP call` lines, outcomes {out['log']['outcomes']}, median "
              f"{out['log']['seconds_median_ms']} ms (logged to the ms); {len(out['log']['warnings'])} warnings/errors")  # fmt: skip
        for w in out["log"]["warnings"]:
            print(
                f"    {w.get('level')}: {w.get('event')} { ({k: v for k, v in w.items() if k not in ('event', '_t')}) }"
            )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--max-output-tokens", type=int, default=64, help="each turn's cap, both variants")
    p.add_argument("--busy", type=int, default=1, help="spinning processes in the busy phase (0: no busy phase)")
    p.add_argument("--no-http", dest="http", action="store_false", help="stdio only")
    p.add_argument("--server-arg", action="append", default=[], help="passed to `geniex serve` (repeatable)")
    p.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "mcp.json")
    args = p.parse_args()
    out = asyncio.run(run(args))
    out["args"] = {k: str(v) for k, v in vars(args).items()}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
