"""/v1/cv (OCR) time per image through our server, against the same engine in this process.

    .venv/bin/python bench/cv.py [--rounds 5] [--bounds]

The server is started the way a user starts it, with the bundled OCR model (the `rapidocr`
wheel, vision extra). The baseline is `workers.engines.ocr` loaded here with the same options
the worker gets (threads 0: the physical cores), fed the same encoded image as a Recognize and
stepped: what the server adds is the HTTP request, JSON and base64, the gateway, ZeroMQ and the
worker's loop. Rounds alternate (server, here, server, ...) so slow drift hits both alike, and
never overlap. The images are synthetic: words Pillow renders in its own TrueType font.

Reports the median ms per image each way and the ratio here / server (goal >= 0.95), and checks
that both read the same text. On a busy box the rounds scatter by tens of percent, so it also
reports, for the same server requests, the worker's own seconds per image (its log) against the
client's: the milliseconds the server adds, free of that noise. `--bounds` also sends the largest images the bounds allow (2000 x
2000, and 200 x 2000, which the detector scales to 736 x 7360) and reports their time and the
worker's resident memory after them and at its peak.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx
from PIL import Image, ImageDraw, ImageFont

from bench.launcher import Server
from gateway.models.store import OCR_MODEL_ID, bundled_models
from protocol.wire import Recognize, TextRegions
from workers.engines.ocr import load

WORDS = "the quick brown fox jumps over a lazy dog while invoice 4711 waits for payment".split()


def page(size: tuple[int, int], lines: int, font_px: int) -> bytes:
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=font_px)
    for i in range(lines):
        text = " ".join(WORDS[(i * 3 + k) % len(WORDS)] for k in range(4)) + f" {i + 1}"
        draw.text((30, 30 + i * int(font_px * 1.8)), text, fill="black", font=font)
    out = io.BytesIO()
    img.save(out, "PNG")
    return out.getvalue()


IMAGES = {
    "label 360x240, 2 lines": page((360, 240), 2, 32),
    "page 1000x800, 12 lines": page((1000, 800), 12, 30),
}
BOUNDS = {
    "bound 2000x2000, 30 lines": page((2000, 2000), 30, 36),
    "bound 200x2000 (tall 10:1)": page((200, 2000), 40, 14),
}


def peak_rss(pid: int) -> int:
    """The process's peak resident memory (Linux: VmHWM), in bytes; 0 where it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def texts(regions: list[str]) -> str:
    return " | ".join(regions)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--bounds", action="store_true", help="also time the largest images the bounds allow")
    args = p.parse_args()
    entry = next((e for e in bundled_models() if e.id == OCR_MODEL_ID), None)
    if entry is None or importlib.util.find_spec("rapidocr") is None:
        print("the bundled OCR model needs the vision extra (pip install -e '.[vision]')")
        return 1
    opts = SimpleNamespace(model_path=entry.path, compute="cpu", nctx=0, ngl=0, parallel=1, threads=0,
                           stream_interval_ms=0, batch_tokens=0, cache_ram_mb=0)  # fmt: skip
    engine = load(opts)
    srv = Server(Path(tempfile.mkdtemp(prefix="geniex-bench-cv-")))
    report: dict[str, dict[str, object]] = {}
    try:
        srv.wait_ready()
        client = httpx.Client(base_url=srv.base_url, timeout=600)
        request_ids: list[tuple[str, float]] = []  # each server request's id and client-side seconds

        def server_once(png: bytes) -> tuple[float, str]:
            body = json.dumps({"model": OCR_MODEL_ID, "image": base64.b64encode(png).decode()}).encode()
            t0 = time.perf_counter()
            r = client.post("/v1/cv", content=body, headers={"content-type": "application/json"})
            dt = time.perf_counter() - t0
            r.raise_for_status()
            request_ids.append((r.headers["x-request-id"], dt))
            return dt, texts([x["label"] for x in r.json()["results"]])

        def here_once(png: bytes) -> tuple[float, str]:
            out: list[object] = []
            t0 = time.perf_counter()
            engine.submit(Recognize(0, "bench", png))
            engine.step(out.append)
            dt = time.perf_counter() - t0
            (answer,) = out
            assert isinstance(answer, TextRegions), answer
            return dt, texts([x.text for x in answer.regions])

        server_once(IMAGES["label 360x240, 2 lines"])  # loads the worker
        for name, png in IMAGES.items():
            server_once(png)  # warm-up, each side
            here_once(png)
            first = len(request_ids)
            ours, theirs, read = [], [], set()
            for _ in range(args.rounds):
                dt, text = server_once(png)
                ours.append(dt)
                read.add(text)
                dt, text = here_once(png)
                theirs.append(dt)
                read.add(text)
            s, h = statistics.median(ours), statistics.median(theirs)
            # The same request seen from both ends: the worker's own seconds for the image (its log's
            # `ocr done`, decode included, as in-process) against the client's. Both clocks time the
            # same run, so the box's load cannot tell them apart: the gap is what the server adds.
            own = {e["request_id"]: e["seconds"] for e in srv.events() if e.get("event") == "ocr done"}
            gaps = [(dt - own[rid], own[rid] / dt) for rid, dt in request_ids[first:] if rid in own]
            added_ms = statistics.median(g for g, _ in gaps) * 1000
            inside = statistics.median(f for _, f in gaps)
            # Each round's own ratio too (a server image and the in-process one right after it): on
            # a busy box the load drifts between rounds, and a pair sees about the same load.
            paired = statistics.median(b / a for a, b in zip(ours, theirs))
            report[name] = {"server_ms": round(s * 1000, 1), "inproc_ms": round(h * 1000, 1),
                            "ratio": round(h / s, 3), "paired_ratio": round(paired, 3),
                            "server_added_ms": round(added_ms, 1), "worker_over_client": round(inside, 4),
                            "same_text": len(read) == 1,
                            "text": sorted(read)[0], "server_rounds_ms": [round(t * 1000, 1) for t in ours],
                            "inproc_rounds_ms": [round(t * 1000, 1) for t in theirs]}  # fmt: skip
            print(f"{name:28s} server {s * 1000:8.1f} ms   in-process {h * 1000:8.1f} ms   "
                  f"ratio {h / s:.3f} (paired {paired:.3f})   same text: {len(read) == 1}")  # fmt: skip
            print(f"{'':28s} the server adds {added_ms:.1f} ms per image: the worker's own time is "
                  f"{inside:.4f} of the client's")  # fmt: skip
        if args.bounds:
            for name, png in BOUNDS.items():
                dt, text = server_once(png)
                rss = max(srv.rss()["workers"].values(), default=0)
                peak = max((peak_rss(pid) for pid in srv.rss()["workers"]), default=0)
                report[name] = {"server_ms": round(dt * 1000, 1), "worker_rss_mb": rss >> 20,
                                "worker_peak_rss_mb": peak >> 20, "lines": text.count("|") + 1}  # fmt: skip
                print(f"{name:28s} server {dt * 1000:8.1f} ms   worker RSS after it {rss >> 20} MiB, "
                      f"peak so far {peak >> 20} MiB")  # fmt: skip
    finally:
        srv.stop()
        engine.close()
    ratios = [float(v[k]) for v in report.values() for k in ("ratio", "paired_ratio") if k in v]  # type: ignore[arg-type]
    print(f"{'PASS' if min(ratios) >= 0.95 else 'MISS'}: in-process / server >= 0.95 (lowest {min(ratios):.3f})")
    out = REPO / "bench" / "results" / "cv.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
