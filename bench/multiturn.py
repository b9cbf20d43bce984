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
    args = p.parse_args(argv)
    res = asyncio.run(amain(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=2))
    report(res)
    print(json.dumps({"servers": {n: {k: v[k] for k in ("wall_s", "ttft_later_s", "ttft_per_turn_s", "cached_per_turn")}
                                  for n, v in res["servers"].items()}, "ratios": res["ratios"]}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
