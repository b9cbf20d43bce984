"""Multi-turn conversations behind one long system prompt: what prompt caching buys.

    .venv/bin/python bench/multiturn.py [--other llama-server=http://127.0.0.1:8080/v1]

4 conversations run concurrently for 6 turns each, all behind one system prompt of about 1,500
tokens with tool definitions; each turn adds about 100 user tokens and generates 60 (greedy, the
end-of-generation tokens banned so every answer has the same length). The scenario runs for our
server with prompt caching on, our server with it off (`cache_prompt: false`), and each other
server given, in an order that rotates each round; every run of the scenario opens its system
prompt with its own session line, so nothing is reused across runs. It reports, per server and
turn, the median time to first token over the conversations, the total wall time of the
scenario and the prompt tokens reported as reused, then the ratios the issue sets as goals, and
one JSON line.

    .venv/bin/python bench/multiturn.py --after-stop [--rounds 2]

measures instead the turn after a worker is gone: a conversation of about 2,000 tokens, then its
next turn after `POST /v1/models/unload` (an idle stop) and after a restart of the server on the
same data dir, with the prompt cache's disk tier (`--cache-disk`, the default) and without
(`--cache-disk 0`), two servers in one run, rounds alternating. Time to first token, the worker's
load included (what a user waits), and with the worker loaded first (the restore alone).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import openai

from bench.bench import DEFAULT_MODEL, log
from bench.launcher import Server

NO_END = {"0": -100, "2": -100}  # SmolLM2's end-of-generation tokens
TOOLS = [
    {"name": name, "description": f"{what}. Use it whenever the user asks about {what.lower()}.",
     "parameters": {"type": "object", "properties": {p: {"type": "string", "description": f"the {p}"} for p in params},
                    "required": params}}
    for name, what, params in [
        ("get_weather", "Weather forecast for a city", ["city", "unit", "days"]),
        ("search_docs", "Search the product documentation", ["query", "section"]),
        ("create_ticket", "Open a support ticket", ["title", "body", "priority"]),
        ("convert_currency", "Convert an amount between currencies", ["amount", "from", "to"]),
        ("book_meeting", "Book a meeting room", ["room", "start", "end", "attendees"]),
        ("translate", "Translate text between languages", ["text", "source", "target"]),
    ]
]  # fmt: skip
RULES = " ".join(
    f"Rule {i}: when the user mentions topic {i}, answer in plain words, cite the relevant tool by name, "
    f"and keep the reply short and friendly."
    for i in range(1, 36)
)


def system_prompt(session: str) -> str:
    return (f"Session {session}. You are the support assistant of a software company.\n{RULES}\n"
            f"You can call these tools:\n{json.dumps(TOOLS, indent=1)}")  # fmt: skip


def user_turn(conv: int, turn: int) -> str:
    return (f"Conversation {conv}, question {turn}: I am planning a trip and a product launch at the same time, "
            f"and I keep mixing up the details. Could you remind me which of the tools above would help with "
            f"topic {turn * 5 + conv}, what the weather is usually like in spring, and how I should phrase a "
            f"support ticket about a missing invoice? Please answer step by step, briefly.")  # fmt: skip


async def conversation(client: openai.AsyncOpenAI, model: str, session: str, conv: int, turns: int,
                       max_tokens: int, body: dict[str, Any]) -> list[dict[str, Any]]:  # fmt: skip
    messages: list[dict[str, str]] = [{"role": "system", "content": system_prompt(session)}]
    out = []
    for turn in range(1, turns + 1):
        messages.append({"role": "user", "content": user_turn(conv, turn)})
        t0 = time.perf_counter()
        first = None
        parts: list[str] = []
        usage = None
        stream = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True}, logit_bias=NO_END, extra_body=body or None,
        )  # fmt: skip
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.choices and chunk.choices[0].delta.content:
                if first is None:
                    first = time.perf_counter()
                parts.append(chunk.choices[0].delta.content)
        details = usage.prompt_tokens_details if usage is not None else None
        end = time.perf_counter()
        out.append({
            "turn": turn,
            "ttft_s": (first or end) - t0,
            "total_s": end - t0,
            "prompt_tokens": usage.prompt_tokens if usage is not None else None,
            "cached_tokens": details.cached_tokens if details is not None else None,
        })  # fmt: skip
        messages.append({"role": "assistant", "content": "".join(parts)})
    return out


async def scenario(client: openai.AsyncOpenAI, args: argparse.Namespace, body: dict[str, Any]) -> dict[str, Any]:
    session = uuid.uuid4().hex[:12]
    t0 = time.perf_counter()
    convs = await asyncio.gather(*(conversation(client, args.model, session, c, args.turns, args.max_tokens, body)
                                   for c in range(args.conversations)))  # fmt: skip
    wall = time.perf_counter() - t0
    per_turn = []
    for turn in range(args.turns):
        rows = [c[turn] for c in convs]
        cached = [r["cached_tokens"] for r in rows if r["cached_tokens"] is not None]
        per_turn.append({
            "ttft_s": statistics.median(r["ttft_s"] for r in rows),
            "total_s": statistics.median(r["total_s"] for r in rows),
            "prompt_tokens": statistics.median(r["prompt_tokens"] or 0 for r in rows),
            "cached_tokens": sum(cached) if cached else None,
        })  # fmt: skip
    later = [t["ttft_s"] for t in per_turn[1:]]
    return {"wall_s": wall, "turns": per_turn, "ttft_later_s": statistics.mean(later) if later else None}


def after_stop(args: argparse.Namespace) -> dict[str, Any]:
    """The turn after an idle stop and after a restart, with the disk tier and without."""
    import httpx

    def ttft(base: str, messages: list[dict[str, str]]) -> tuple[float, int]:
        body = {"model": args.model, "messages": messages, "max_tokens": 8, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        t0 = time.perf_counter()
        first, cached = 0.0, 0
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=600) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{r.status_code}: {r.read().decode(errors='replace')}")
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if not first and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                    first = time.perf_counter() - t0
                usage = chunk.get("usage") or {}
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", cached) or cached
        if not first:
            raise RuntimeError("no token came back")
        return first, cached

    def unload(base: str, load_again: bool) -> None:
        httpx.post(f"{base}/v1/models/unload", json={"model": args.model}, timeout=60).raise_for_status()
        if load_again:
            httpx.post(f"{base}/v1/models/load", json={"model": args.model}, timeout=300).raise_for_status()

    modes = {"disk tier": [], "no disk tier": ["--cache-disk", "0"]}
    results: dict[str, dict[str, list[float]]] = {m: {} for m in modes}
    with tempfile.TemporaryDirectory(prefix="geniex-after-stop-") as tmp:
        for r in range(args.rounds):
            for mode in list(modes)[r % 2 :] + list(modes)[: r % 2]:
                data = Path(tmp) / mode.replace(" ", "-")
                flags = ("--nctx", str(args.nctx), "--parallel", "1", *modes[mode])
                srv = Server(data, *flags)
                srv.wait_ready()
                system = system_prompt(uuid.uuid4().hex)
                convo = [{"role": "system", "content": system}, {"role": "user", "content": user_turn(0, 1)}]
                cold, _ = ttft(srv.base_url, convo)
                prompt = httpx.post(f"{srv.base_url}/v1/messages/count_tokens", timeout=60,
                                    json={"model": args.model, "messages": [{"role": "user", "content": system}]})  # fmt: skip
                turn = [
                    *convo,
                    {"role": "assistant", "content": "Noted."},
                    {"role": "user", "content": user_turn(0, 2)},
                ]
                got: dict[str, float] = {"cold turn 1": cold, "system prompt tokens": prompt.json()["input_tokens"]}
                for label, load_again in (("after unload, load included", False), ("after unload, loaded", True)):
                    unload(srv.base_url, load_again)
                    got[label], cached = ttft(srv.base_url, turn)
                    got[f"{label}: cached tokens"] = cached
                srv.stop()
                srv = Server(data, *flags)
                srv.wait_ready()
                got["after restart"], got["after restart: cached tokens"] = ttft(srv.base_url, turn)
                srv.stop()
                for k, v in got.items():
                    results[mode].setdefault(k, []).append(v)
                log(f"round {r + 1}/{args.rounds} {mode}: " + ", ".join(f"{k} {v:.2f}" for k, v in got.items()))
    out: dict[str, Any] = {"modes": {m: {k: statistics.median(v) for k, v in ks.items()} for m, ks in results.items()}}
    on, off = out["modes"]["disk tier"], out["modes"]["no disk tier"]
    out["ratios"] = {
        f"{k}: without over with": off[k] / on[k]
        for k in on
        if "cached" not in k and "cold" not in k and "tokens" not in k
    }
    return out


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="geniex-multiturn-") as tmp:
        srv = Server(Path(tmp), "--nctx", str(args.nctx), *args.server_arg)
        try:
            srv.wait_ready()
            kw: dict[str, Any] = {"api_key": "unused", "max_retries": 0, "timeout": 600}
            ours = openai.AsyncOpenAI(base_url=f"{srv.base_url}/v1", **kw)
            modes: dict[str, tuple[openai.AsyncOpenAI, dict[str, Any]]] = {
                "ours": (ours, {}),
                "ours, cache off": (ours, {"cache_prompt": False}),
            }
            for spec in args.other:
                name, _, url = spec.partition("=")
                modes[name] = (openai.AsyncOpenAI(base_url=url, **kw), {})
            await ours.chat.completions.create(model=args.model, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=1)  # fmt: skip
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
            names = list(modes)
            for r in range(args.rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    client, body = modes[name]
                    res = await scenario(client, args, body)
                    runs[name].append(res)
                    log(f"round {r + 1}/{args.rounds} {name}: wall {res['wall_s']:.1f} s, turn TTFT "
                        + " ".join(f"{t['ttft_s']:.2f}" for t in res["turns"]))  # fmt: skip
        finally:
            srv.stop()
    out: dict[str, Any] = {"servers": {}}
    for name, rs in runs.items():
        out["servers"][name] = {
            "wall_s": median_of(rs, "wall_s"),
            "ttft_later_s": median_of(rs, "ttft_later_s"),
            "ttft_per_turn_s": [statistics.median(r["turns"][t]["ttft_s"] for r in rs) for t in range(args.turns)],
            "total_per_turn_s": [statistics.median(r["turns"][t]["total_s"] for r in rs) for t in range(args.turns)],
            "prompt_tokens_per_turn": [rs[-1]["turns"][t]["prompt_tokens"] for t in range(args.turns)],
            "cached_per_turn": [rs[-1]["turns"][t]["cached_tokens"] for t in range(args.turns)],
            "runs": rs,
        }
    o = out["servers"]["ours"]
    off = out["servers"]["ours, cache off"]
    out["ratios"] = {"ttft_turns_2_6_off_over_on": off["ttft_later_s"] / o["ttft_later_s"]}
    for name in args.other:
        n = name.partition("=")[0]
        t = out["servers"][n]
        out["ratios"][f"ttft_turns_2_6_ours_over_{n}"] = o["ttft_later_s"] / t["ttft_later_s"]
        out["ratios"][f"wall_ours_over_{n}"] = o["wall_s"] / t["wall_s"]
    return out


def report(res: dict[str, Any]) -> None:
    for name, v in res["servers"].items():
        ttft = " ".join(f"{x:6.2f}" for x in v["ttft_per_turn_s"])
        total = " ".join(f"{x:6.2f}" for x in v["total_per_turn_s"])
        cached = " ".join("   n/a" if c is None else f"{c:6d}" for c in v["cached_per_turn"])
        print(f"{name:>20}: wall {v['wall_s']:6.1f} s | TTFT per turn (s) {ttft} | whole turn (s) {total} | "
              f"reused tokens per turn {cached}")  # fmt: skip
    print("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in res["ratios"].items()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--other", action="append", default=[], metavar="NAME=URL",
                   help="another OpenAI-compatible server's base URL (…/v1); repeatable")  # fmt: skip
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=60)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--nctx", type=int, default=4096)
    p.add_argument("--server-arg", action="append", default=[], help="passed to `geniex serve` (repeatable)")
    p.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "multiturn.json")
    p.add_argument("--after-stop", action="store_true", help="the turn after an idle stop and a restart (see above)")
    args = p.parse_args(argv)
    if args.after_stop:
        out = after_stop(args)
        print(json.dumps(out, indent=2))
        return 0
    res = asyncio.run(amain(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=2))
    report(res)
    print(json.dumps({"servers": {n: {k: v[k] for k in ("wall_s", "ttft_later_s", "ttft_per_turn_s", "cached_per_turn")}
                                  for n, v in res["servers"].items()}, "ratios": res["ratios"]}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
