"""A stand-in OpenAI-compatible server that streams at a fixed pace, for bench/upstream.py.

    .venv/bin/python bench/paced_upstream.py --port 8123 --pace-ms 5

Every chat completion streams `max_tokens` one-word chunks, chunk i sent at (start + i * pace), then
the finish chunk, the usage chunk and `[DONE]`. It computes nothing, so a client's decode rate
through a relay against its rate talking to this directly is the relay's own cost, free of the
model's speed drifting with the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

WORDS = [" the", " dragon", ",", " who", " learned", " to", " code", "."]


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pace: float) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method = lines[0].split(" ")[0]
        length = next((int(h.split(":", 1)[1]) for h in lines[1:] if h.lower().startswith("content-length:")), 0)
        body = json.loads(await reader.readexactly(length)) if length else {}
        if method == "GET":
            payload = json.dumps({"object": "list", "data": [{"id": "paced", "object": "model"}]}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                         b"content-length: %d\r\n\r\n" % len(payload) + payload)  # fmt: skip
            return
        n = int(body.get("max_tokens") or 16)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        base = {"id": "paced", "object": "chat.completion.chunk", "created": int(time.time()), "model": "paced"}
        t0 = time.perf_counter()
        for i in range(n):
            delay = t0 + i * pace - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            delta = {"content": WORDS[i % len(WORDS)]}
            writer.write(_event({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}))
            await writer.drain()
        writer.write(_event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}))
        writer.write(_event({**base, "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": n,
                                                              "total_tokens": 10 + n}}))  # fmt: skip
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, ValueError):
        pass
    finally:
        writer.close()


async def serve(port: int, pace_ms: float) -> None:
    server = await asyncio.start_server(lambda r, w: _handle(r, w, pace_ms / 1000), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pace-ms", type=float, default=5.0)
    args = p.parse_args()
    asyncio.run(serve(args.port, args.pace_ms))


if __name__ == "__main__":
    main()
