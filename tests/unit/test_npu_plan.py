"""The NPU plan (protocol/npu_plan.py, `geniex npu plan`): what fits a Snapdragon's NPU is decided
from the model's shape, before anything is converted or compiled."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import pytest

from protocol import npu_plan
from protocol.npu_plan import SOCS, Shape, plan, split
from tests.npu_models import bundled_gguf

LLAMA_1B = Shape(n_layer=16, n_embd=2048, n_head=32, n_head_kv=8, head_dim=64, n_ff=8192, n_vocab=128256)
LLAMA_3B = Shape(n_layer=28, n_embd=3072, n_head=24, n_head_kv=8, head_dim=128, n_ff=8192, n_vocab=128256)
LLAMA_8B = Shape(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128, n_ff=14336, n_vocab=128256,
                 head_bits=8)  # fmt: skip
X_ELITE = SOCS["x-elite"]


def test_a_1b_model_fits_an_x_elite_at_about_0_6_bytes_per_parameter() -> None:
    p = plan(LLAMA_1B, X_ELITE, 4096, shared_weights=False)
    assert p.fits and len(p.parts) == 1 and 0.6 < p.bytes_per_param < 0.7, p
    assert p.binary_bytes <= X_ELITE.binary_limit and p.process_bytes <= X_ELITE.process_limit


def test_an_8b_model_is_refused_naming_the_size_and_the_limit() -> None:
    p = plan(LLAMA_8B, X_ELITE, 4096, shared_weights=True)
    assert not p.fits and "GB of NPU memory" in p.why_not and "4.00 GB" in p.why_not, p.why_not
    assert all(part.weight_bytes <= npu_plan.PART_LIMIT for part in p.parts) and len(p.parts) >= 3


def test_a_3b_model_fits_only_with_shared_weights() -> None:
    """Built on the device, prefill and decode each hold the weights: over the process's memory."""
    assert not plan(LLAMA_3B, X_ELITE, 4096, shared_weights=False).fits
    assert plan(LLAMA_3B, X_ELITE, 4096, shared_weights=True).fits


def test_the_workers_plan_counts_the_weights_once_where_its_binaries_share_them(tmp_path: Path) -> None:
    """Imported from a weight-shared bundle (protocol/npu_bundle.py), prefill and decode hold one copy."""
    from workers.engines.npu.engine import NpuUnavailable, check_fits

    unshared, _ = npu_plan.plan_here(LLAMA_3B, None)
    shared, _ = npu_plan.plan_here(LLAMA_3B, None, shared_weights=True)
    assert shared.shared_weights and shared.process_bytes == unshared.process_bytes - unshared.weight_bytes
    assert not unshared.fits and shared.fits
    gguf_3b = str(_header_only_gguf(tmp_path / "3b.gguf", LLAMA_3B))
    assert check_fits(gguf_3b, 1024, shared_weights=True).fits
    with pytest.raises(NpuUnavailable, match="twice"):
        check_fits(gguf_3b, 1024)


def test_the_gateway_plans_and_counts_an_imported_shared_bundle_as_its_worker_loads_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A 3B model imported from a weight-shared bundle: a no-fallback npu request is not refused as
    too big, and the memory estimate holds its weights once; on hybrid (unshared) it is refused."""
    import msgspec

    from gateway.supervisor.compute import why_not_exactly
    from gateway.supervisor.memory import npu_chat_bytes
    from protocol import qnn
    from protocol.npu_bundle import BUNDLE_FILE, Bundle, serves_shared
    from protocol.npu_cache import cache_key

    monkeypatch.setattr(qnn, "is_simulated", lambda: False)  # a Snapdragon, which loads shared binaries
    monkeypatch.setattr(qnn, "_installed", lambda: True)
    gguf_3b = str(_header_only_gguf(tmp_path / "3b.gguf", LLAMA_3B))
    npu_cache = tmp_path / "npu"
    assert "does not fit this NPU" in str(why_not_exactly("npu", "llama_cpp", gguf_3b, 1024, npu_cache))
    unshared_bytes = npu_chat_bytes(gguf_3b, 1024)

    converted = npu_cache / cache_key(gguf_3b)
    converted.mkdir(parents=True)
    bundle = Bundle(model="o/r:Q4_0", gguf="3b.gguf", soc="x-elite", qnn_version="2.7.0", converter_version=3,
                    nctx=1024, files=[], shared_weights=True)  # fmt: skip
    (converted / BUNDLE_FILE).write_bytes(msgspec.json.encode(bundle))
    assert serves_shared(npu_cache, gguf_3b, "npu") and not serves_shared(npu_cache, gguf_3b, "hybrid")
    assert why_not_exactly("npu", "llama_cpp", gguf_3b, 1024, npu_cache) is None
    assert "does not fit this NPU" in str(why_not_exactly("hybrid", "llama_cpp", gguf_3b, 1024, npu_cache))
    weights = sum(p.weight_bytes for p in split(LLAMA_3B))
    shared_bytes = npu_chat_bytes(gguf_3b, 1024, shared_weights=True)
    assert unshared_bytes - shared_bytes == int(weights * 1.5 * 2) - int(weights * 1.5)
    monkeypatch.setattr(qnn, "is_simulated", lambda: True)  # the simulator would crash loading them
    assert not serves_shared(npu_cache, gguf_3b, "npu")


def test_parts_cover_every_layer_once_and_the_head_last() -> None:
    for limit in (10**12, 700_000_000, 200_000_000, 1):
        parts = split(LLAMA_1B, limit)
        layers = [i for part in parts for i in range(part.first_layer, part.end_layer)]
        assert layers == list(range(LLAMA_1B.n_layer)) and [p.head for p in parts] == [False] * (len(parts) - 1) + [
            True
        ]
        assert sum(p.weight_bytes for p in parts) == LLAMA_1B.n_layer * LLAMA_1B.layer_bytes() + LLAMA_1B.head_bytes()
        if limit > LLAMA_1B.layer_bytes():  # a part holds as many layers as its limit allows, never more
            assert all(p.weight_bytes <= limit or p.end_layer - p.first_layer <= 1 for p in parts)


def _header_only_gguf(path: Path, shape: Shape) -> Path:
    """A GGUF with a decoder's header and no tensors: all the plan reads."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(shape.n_layer)
    w.add_embedding_length(shape.n_embd)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_feed_forward_length(shape.n_ff)
    w.add_vocab_size(shape.n_vocab)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _geniex(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "npu", "plan", *args], capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_the_plan_command_accepts_smollm2_and_refuses_an_8b_shape_with_the_reason(tmp_path: Path) -> None:
    ok = _geniex(bundled_gguf())
    assert ok.returncode == 0 and ok.stdout.rstrip().endswith("fits"), ok.stdout + ok.stderr
    big = _geniex(str(_header_only_gguf(tmp_path / "8b.gguf", LLAMA_8B)), "--soc", "8-elite")
    assert big.returncode == 1 and "does not fit" in big.stdout and "Snapdragon 8 Elite" in big.stdout, big.stdout


@pytest.mark.parametrize("content", [b"", b"GGUF\x03\x00\x00\x00", b"not a gguf at all"])
def test_a_broken_file_is_one_line_naming_it(tmp_path: Path, content: bytes) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    done = _geniex(str(bad))
    assert done.returncode != 0 and "bad.gguf" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_soc_comes_from_the_setting_then_the_device_tree_then_a_stated_assumption(tmp_path: Path) -> None:
    tree = tmp_path / "compatible"
    tree.write_bytes(b"lenovo,thinkpad-t14s\0qcom,x1e78100\0qcom,x1e80100\0")
    assert npu_plan.detect_soc({"GENIEX_QNN_SOC_MODEL": "57"}, tree)[0].name == "8-gen-3"
    soc, how = npu_plan.detect_soc({}, tree)
    assert soc.name == "x-elite" and "qcom,x1e78100" in how
    soc, how = npu_plan.detect_soc({"GENIEX_QNN_SOC_MODEL": "banana"}, tmp_path / "none")
    assert soc.name == npu_plan.DEFAULT_SOC and "assumed" in how


def test_the_npu_worker_refuses_what_cannot_fit_before_converting_anything(tmp_path: Path) -> None:
    from workers.engines.npu.engine import NpuUnavailable, check_fits

    assert check_fits(bundled_gguf(), 1024).fits
    with pytest.raises(NpuUnavailable, match="GB of NPU memory"):
        check_fits(str(_header_only_gguf(tmp_path / "8b.gguf", LLAMA_8B)), 1024)
    (tmp_path / "cut.gguf").write_bytes(Path(bundled_gguf()).read_bytes()[:64])
    with pytest.raises(NpuUnavailable, match=r"cut\.gguf: the GGUF header cannot be read"):
        check_fits(str(tmp_path / "cut.gguf"), 1024)
    assert not list(tmp_path.glob("*/npu.json")), "nothing was converted"


def test_compile_refuses_what_cannot_fit_before_building_anything(tmp_path: Path) -> None:
    data = tmp_path / "data"
    big = _header_only_gguf(tmp_path / "8b.gguf", LLAMA_8B)
    pulled = subprocess.run([sys.executable, "-m", "gateway.cli", "pull", "test/big:Q4_0", "--local", str(big),
                             "--data-dir", str(data)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr

    def compile_(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gateway.cli", "npu", "compile", "test/big:Q4_0", "--data-dir",
                               str(data), *args], capture_output=True, text=True, timeout=60)  # fmt: skip

    refused = compile_("--soc", "x-elite")
    assert refused.returncode == 1 and "does not fit the Snapdragon X Elite" in refused.stderr, refused.stderr
    assert not (data / "npu").exists(), "nothing was converted"
    assert compile_("--nctx", "0").returncode != 0
    (tmp_path / "out").mkdir()
    taken = compile_("--bundle", str(tmp_path / "out"))
    assert taken.returncode != 0 and "already exists" in taken.stderr
