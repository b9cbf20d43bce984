"""The soak harness (bench/soak.py), CI-sized: half a minute of mixed load from 16 clients on two
chat models and an embedding model under --max-loaded 2, with every fault injected at least once,
and every invariant it checks asserted here (none of them on timing).

Thirty seconds are 8 of warm-up, 17 of the main phase and 5 of drain, and faults run in the first
two: the fault intervals are sized so that each fault still comes two or more times (three runs at
30 s on a busy two-core box: 5 to 7 kills, 2 to 4 hangs, 3 bursts, 3 disk-full episodes, 3 to 11
disconnects, 17 to 22 malformed requests). A kill every 4 s, as at 50 s, is plenty and leaves
streams that live long enough to be left: at one every 2.4 s most streams died first, and the
disconnects fell to 2 or 3 a run even with twice the rate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_half_a_minute_of_chaos_keeps_every_invariant(tmp_path: Path) -> None:
    cmd = [sys.executable, str(REPO / "bench" / "soak.py"), "--duration", "30", "--kill-every", "4",
           "--hang-every", "5", "--burst-every", "6", "--disk-every", "6", "--disk-hold", "1.5", "--disconnect-rate", "0.5",
           "--malformed-rate", "0.08", "--drain-timeout-s", "5", "--work-dir", str(tmp_path / "soak")]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    lines = out.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("{"), out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(lines[-1])
    assert "harness_error" not in report, out.stdout[-3000:] + out.stderr[-3000:]
    detail = "\n".join(lines[-60:-1])
    for name, ok in report["invariants"].items():
        assert ok, f"{name}: {report['failures'].get(name)}\n{detail}"
    faults = report["faults"]
    for fault in ("worker_kills", "worker_hangs", "bursts", "busy_503", "disconnects", "malformed"):
        assert faults[fault] >= 1, (fault, faults)
    if os.geteuid() == 0:  # the disk-full fault mounts a tmpfs
        assert faults["disk_full_episodes"] >= 1 and "disk_full_counted" in report["invariants"], faults
    assert report["drain"]["exit_status"] == 0
    assert report["ledger"]["answered"] > 0 and report["ledger"]["missing"] == 0
    assert out.returncode == 0, detail
