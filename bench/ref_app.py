"""A bare ASGI app for uvicorn that answers every request with `{"status":"ok"}`.

The /health reference: probed exactly like the gateway, it shows what this machine, the
probe and uvicorn cost by themselves, so the gateway's own share of /health latency can
be read off (`python -m uvicorn bench.ref_app:app --port PORT`).
"""

BODY = b'{"status":"ok"}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})
