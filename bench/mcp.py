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
  plain `add` of `client` is a different prompt: the model writes a shorter name in its call and
  may answer otherwise (it does here: bench/README.md), which the report says.

Both variants are capped at `--max-output-tokens` in all: the server's `max_output_tokens` bounds
the whole response (its second turn gets what the first left), and the client's second request
gets what its first left (64 lets both turns end by themselves). Rounds interleave the variants
after a warm-up, in an order that rotates and reverses every round, so drift in the machine's
load hits all alike and no variant runs twice in a row (the second would find its whole prompt in
the worker's cache). Every request carries an `x-request-id` of the bench's own, so that the server's log gives each round's
model time: the worker's `generation done` seconds of its turns. Per variant it reports the
median and p90 of:

- wall: the whole round at the client;
- wall - model: the round less the model's generations: HTTP, the SDKs, the gateway's planning
  and rendering, the stored response looked up by `previous_response_id`, and the tool's call.
  The model's time swings by tens of percent between rounds on a shared box and buries the rest;
  this is the figure that shows what running the call in the server costs or saves;
- in gw, out: wall - model split in two by the gateway's `request` log lines: the gateway's own
  time less the model's (with the server's call in it), and the time outside the gateway (the
  client's SDK, HTTP, and the client's call);
- tool: the server's call time (`geniex:mcp_call_seconds` on /metrics, read between rounds; the
  `MCP call` log lines' `seconds` are in the JSON too) against the client's own `call_tool` time;
- the gateway process's CPU time per round (mean: psutil's times tick in 10 ms);

the ratio server / client of the wall times (of the medians, and the median of per-round
ratios), the paired median difference of wall - model, and the tokens (input, cached input,
output, summed over both turns) and the answer text, checked equal where they should be. With
`--busy N` (default 1) it all runs again with N spinning processes beside the server
(bench/contention.py's neighbour; 0: no busy phase). Everything, every round included, goes to
`--json` (default bench/results/mcp.json).
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
import psutil

from bench.contention import Hogs
from bench.launcher import Server, end, free_port
from bench.stats import pct

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1"
QUESTION = "What is 2 plus 3?"
TOOL = "add"
TEST_SERVER = REPO / "tests" / "mcp_test_server.py"
LABELS = {"stdio": "calc", "http": "calc_http"}

Result = dict[str, Any]
Variant = Callable[[str], Awaitable[Result]]


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
        end(proc, 10)


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


def cpu_of(proc: psutil.Process) -> Callable[[], float]:
    return lambda: sum(proc.cpu_times()[:2])


def server_variant(oa: openai.AsyncOpenAI, http: httpx.AsyncClient, base: str, label: str, cap: int,
                   gateway_cpu: Callable[[], float]) -> Variant:  # fmt: skip
    body: dict[str, Any] = {
        "model": MODEL, "input": QUESTION, "temperature": 0, "max_output_tokens": cap, "max_tool_calls": 1,
        "tools": [{"type": "mcp", "server_label": label, "allowed_tools": [TOOL], "require_approval": "never"}],
        "tool_choice": {"type": "mcp", "server_label": label, "name": TOOL},
    }  # fmt: skip

    async def run(rid: str) -> Result:
        before = mcp_seconds((await http.get(f"{base}/metrics")).text, label)
        c0 = gateway_cpu()
        t0 = time.perf_counter()
        resp = await oa.responses.create(**body, extra_headers={"x-request-id": rid})
        wall = time.perf_counter() - t0
        cpu = gateway_cpu() - c0
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
        return {"ids": [rid], "wall_s": wall, "gateway_cpu_s": cpu, "tool_s": after[0] - before[0], "input_tokens": inp,
                "output_tokens": out, "cached_tokens": cached, "text": resp.output_text,
                "arguments": calls[0].arguments if calls else None, "tool_output": calls[0].output if calls else None,
                "status": resp.status, "problems": problems}  # fmt: skip

    return run


def client_variant(oa: openai.AsyncOpenAI, session: Any, tool: Any, label: str | None, cap: int,
                   gateway_cpu: Callable[[], float]) -> Variant:  # fmt: skip
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

    async def run(rid: str) -> Result:
        ids = [f"{rid}-1", f"{rid}-2"]
        c0 = gateway_cpu()
        t0 = time.perf_counter()
        resp = await oa.responses.create(**first, extra_headers={"x-request-id": ids[0]})
        calls = [o for o in resp.output if o.type == "function_call"]
        problems = [] if len(calls) == 1 else [f"{len(calls)} function calls in the first turn"]
        if not calls:
            return {"ids": ids[:1], "wall_s": time.perf_counter() - t0, "problems": problems}
        call = calls[0]
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            return {"ids": ids[:1], "wall_s": time.perf_counter() - t0,
                    "problems": [f"arguments cut or malformed: {call.arguments}"]}  # fmt: skip
        t1, p1 = time.perf_counter(), time.process_time()
        result = await session.call_tool(call.name, arguments)
        t2, p2 = time.perf_counter(), time.process_time()
        text = "\n".join(b.text for b in result.content if getattr(b, "type", "") == "text")
        if not text and result.structured_content is not None:
            text = json.dumps(result.structured_content, ensure_ascii=False)
        if result.is_error:
            problems.append(f"the tool failed: {text}")
        # The server's `max_output_tokens` bounds the whole response: its second turn gets what
        # the first left, and so does the client's second request.
        left = cap - usage_of(resp)[1]
        second: dict[str, Any] = {"model": MODEL, "previous_response_id": resp.id, "temperature": 0,
                                  "max_output_tokens": left, "tools": tools, "tool_choice": "none",
                                  "input": [{"type": "function_call_output", "call_id": call.call_id, "output": text}]}  # fmt: skip
        resp2 = await oa.responses.create(**second, extra_headers={"x-request-id": ids[1]})
        t3 = time.perf_counter()
        cpu = gateway_cpu() - c0
        (i1, o1, c1), (i2, o2, c2) = usage_of(resp), usage_of(resp2)
        return {"ids": ids, "wall_s": t3 - t0, "gateway_cpu_s": cpu, "tool_s": t2 - t1, "tool_cpu_s": p2 - p1, "input_tokens": i1 + i2, "output_tokens": o1 + o2,
                "cached_tokens": c1 + c2, "text": resp2.output_text, "arguments": call.arguments,
                "tool_output": text, "status": resp2.status, "problems": problems}  # fmt: skip

    return run


def order(names: list[str], i: int) -> list[str]:
    """Round i's order: rotated by i, reversed every other round. No variant runs twice in a row
    (back to back, the second would find its whole prompt in the worker's cache) and each follows
    different ones from round to round."""
    k = i % len(names)
    turned = names[k:] + names[:k]
    return turned if i % 2 == 0 else turned[::-1]


async def measure(variants: dict[str, Variant], reps: int, warmup: int, phase: str) -> dict[str, list[Result]]:
    """`warmup` rounds of each, then `reps` rounds. Each round's requests carry ids of the bench's
    own (x-request-id), to find their lines in the server's log."""
    names = list(variants)
    for w in range(warmup):
        for name in names:
            await variants[name](f"warm-{phase}-{name}-{w}")
    got: dict[str, list[Result]] = {n: [] for n in names}
    for i in range(reps):
        for name in order(names, i):
            got[name].append(await variants[name](f"{phase}-{name}-{i}"))
    return got


def from_log(events: list[dict[str, Any]], phases: dict[str, dict[str, list[Result]]]) -> None:
    """Each round's model time (the worker's `generation done` seconds, summed over its turns), the
    gateway's own time (its `request` lines' ms) and the tool's time as the gateway logged it."""
    gen: dict[str, float] = {}
    gw: dict[str, float] = {}
    tool: dict[str, float] = {}
    for e in events:
        rid, ev = e.get("request_id"), e.get("event")
        if not isinstance(rid, str):
            continue
        if ev == "generation done":
            gen[rid] = gen.get(rid, 0.0) + float(e["seconds"])
        elif ev == "request" and e.get("path") == "/v1/responses":
            gw[rid] = gw.get(rid, 0.0) + float(e["ms"]) / 1000
        elif ev == "MCP call":
            tool[rid] = tool.get(rid, 0.0) + float(e["seconds"])
    for got in phases.values():
        for rounds in got.values():
            for r in rounds:
                ids = r["ids"]
                if all(i in gen for i in ids):
                    r["model_s"] = sum(gen[i] for i in ids)
                    r["off_model_s"] = r["wall_s"] - r["model_s"]
                if all(i in gw for i in ids):
                    r["gateway_s"] = sum(gw[i] for i in ids)
                    r["outside_gateway_s"] = r["wall_s"] - r["gateway_s"]
                    if "model_s" in r:
                        r["gateway_off_model_s"] = r["gateway_s"] - r["model_s"]
                if any(i in tool for i in ids):
                    r["tool_log_s"] = sum(tool.get(i, 0.0) for i in ids)


def _ms(values: Iterable[float | None], q: float = 50) -> float | None:
    xs = [v for v in values if v is not None]
    return round((pct(xs, q) or 0.0) * 1000, 2) if xs else None


def summarise(got: dict[str, list[Result]], pairs: list[tuple[str, str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, rounds in got.items():
        v: dict[str, Any] = {}
        keys = ("wall_s", "off_model_s", "model_s", "gateway_s", "gateway_off_model_s", "outside_gateway_s", "tool_s",
                "tool_log_s", "tool_cpu_s")  # fmt: skip
        for key in keys:
            v[key.removesuffix("_s") + "_median_ms"] = _ms(r.get(key) for r in rounds)
            v[key.removesuffix("_s") + "_p90_ms"] = _ms((r.get(key) for r in rounds), 90)
        # psutil's CPU times tick in 10 ms: a mean over the rounds, not a median of ticks.
        v["gateway_cpu_mean_ms"] = round(statistics.mean(r["gateway_cpu_s"] for r in rounds) * 1000, 1)
        v |= {
            "output_tokens": sorted({r.get("output_tokens") for r in rounds}, key=str),
            "input_tokens": sorted({r.get("input_tokens") for r in rounds}, key=str),
            "cached_tokens_median": statistics.median(r.get("cached_tokens", 0) for r in rounds),
            "texts": sorted({r.get("text") for r in rounds}, key=str),
            "arguments": sorted({r.get("arguments") for r in rounds}, key=str),
            "tool_outputs": sorted({r.get("tool_output") for r in rounds}, key=str),
            "statuses": sorted({r.get("status") for r in rounds}, key=str),
            "problems": [p for r in rounds for p in r["problems"]],
            "rounds": [{k: round(x, 4) if isinstance(x, float) else x for k, x in r.items()} for r in rounds],
        }  # fmt: skip
        out[name] = v
    for srv, cli in pairs:
        a, b, sa, sb = got[srv], got[cli], out[srv], out[cli]
        paired = [x["wall_s"] / y["wall_s"] for x, y in zip(a, b, strict=True)]
        off = [x["off_model_s"] - y["off_model_s"] for x, y in zip(a, b, strict=True)
               if "off_model_s" in x and "off_model_s" in y]  # fmt: skip
        out[f"{srv} / {cli}"] = {
            "wall_ratio_of_medians": round(sa["wall_median_ms"] / sb["wall_median_ms"], 3),
            "wall_paired_ratio": round(statistics.median(paired), 3),
            "off_model_difference_ms": _ms(off),
            "same_tokens_and_text": sa["output_tokens"] == sb["output_tokens"] and sa["texts"] == sb["texts"],
            "same_input_tokens": sa["input_tokens"] == sb["input_tokens"],
        }  # fmt: skip
    return out


def _f(x: float | None, width: int, digits: int = 0) -> str:
    return f"{x:{width}.{digits}f}" if x is not None else " " * (width - 1) + "-"


def report(phase: str, s: dict[str, Any], pairs: list[tuple[str, str]]) -> None:
    print(f"--- {phase}: medians (p90) in ms")
    print(f"{'variant':16s} {'wall':>12s} {'wall - model':>12s} {'model':>6s} {'in gw':>5s} {'out':>5s} {'tool':>13s} "
          f"{'gw CPU':>6s} {'call CPU':>8s}  "
          "tokens in (cached)/out, answer")  # fmt: skip
    for name, v in s.items():
        if " / " in name:
            continue
        print(f"{name:16s} {_f(v['wall_median_ms'], 5)} ({_f(v['wall_p90_ms'], 4)}) "
              f"{_f(v['off_model_median_ms'], 5)} ({_f(v['off_model_p90_ms'], 4)}) {_f(v['model_median_ms'], 6)} "
              f"{_f(v['gateway_off_model_median_ms'], 5, 1)} {_f(v['outside_gateway_median_ms'], 5, 1)} "
              f"{_f(v['tool_median_ms'], 5, 2)} ({_f(v['tool_p90_ms'], 5, 2)}) {_f(v['gateway_cpu_mean_ms'], 6, 1)} {_f(v['tool_cpu_median_ms'], 8, 2)}  "
              f"{v['input_tokens']} ({v['cached_tokens_median']:g})/{v['output_tokens']}, {v['texts']!r}")  # fmt: skip
        for p in sorted(set(v["problems"])):
            print(f"    PROBLEM: {p}")
    for srv, cli in pairs:
        r = s[f"{srv} / {cli}"]
        note = "same tokens and text" if r["same_tokens_and_text"] else "NOT the same tokens or text"
        note += ", same prompt tokens" if r["same_input_tokens"] else ", other prompt tokens"
        print(f"{srv} / {cli}: wall {r['wall_ratio_of_medians']:.3f} (medians), {r['wall_paired_ratio']:.3f} "
              f"(paired); wall - model {_f(r['off_model_difference_ms'], 1, 1)} ms (paired median); {note}")  # fmt: skip


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
            cap, cpu = args.max_output_tokens, cpu_of(psutil.Process(srv.proc.pid))
            variants[f"server-{transport}"] = server_variant(oa, http, srv.base_url, label, cap, cpu)
            variants[f"client-{transport}"] = client_variant(oa, session, tool, None, cap, cpu)
            variants[f"client-ns-{transport}"] = client_variant(oa, session, tool, label, cap, cpu)
            pairs += [(f"server-{transport}", f"client-{transport}"), (f"server-{transport}", f"client-ns-{transport}")]
        got: dict[str, dict[str, list[Result]]] = {}
        phases = [("idle", 0)] + ([(f"busy{args.busy}", args.busy)] if args.busy else [])
        for i, (phase, hogs) in enumerate(phases):
            with Hogs(hogs):
                got[phase] = await measure(variants, args.reps, args.warmup if i == 0 else 1, phase)
        await asyncio.sleep(0.5)  # the worker's last log lines
        events = srv.events()
    from_log(events, got)
    out: dict[str, Any] = {}
    for phase, rounds in got.items():
        out[phase] = summarise(rounds, pairs)
        report(f"{phase} ({args.reps} rounds)", out[phase], pairs)
    logged = [e for e in events if e.get("event") == "MCP call"]
    warnings = [e for e in events if e.get("level") in ("warning", "error")]
    out["log"] = {"mcp_calls": len(logged), "outcomes": sorted({str(e.get("outcome")) for e in logged}),
                  "warnings": warnings[:20]}  # fmt: skip
    print(f"server log: {len(logged)} `MCP call` lines, outcomes {out['log']['outcomes']}; "
          f"{len(warnings)} warnings/errors")  # fmt: skip
    for w in warnings[:20]:
        print(f"    {w.get('level')}: {w.get('event')} { ({k: v for k, v in w.items() if k not in ('event', '_t')}) }")
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
