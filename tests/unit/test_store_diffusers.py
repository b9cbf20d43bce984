"""Importing diffusers pipeline folders into the store: what is copied, what is refused.

The folders here hold placeholder bytes, not models: the store copies files and never reads
weights (tests/integration/test_images.py imports and serves a real, synthetic, pipeline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.errors import BadRequest
from gateway.models.store import ModelStore
from gateway.supervisor.memory import estimate_worker_bytes

INDEX = {
    "_class_name": "StableDiffusionPipeline",
    "_diffusers_version": "0.42.1",
    "unet": ["diffusers", "UNet2DConditionModel"],
    "vae": ["diffusers", "AutoencoderKL"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "scheduler": ["diffusers", "DDIMScheduler"],
    "safety_checker": [None, None],
}


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "data", bundled=[])


def pipeline_dir(path: Path, index: dict[str, object] | None = None) -> Path:
    for part in ("unet", "vae", "tokenizer", "scheduler"):
        (path / part).mkdir(parents=True, exist_ok=True)
    (path / "model_index.json").write_text(json.dumps(INDEX if index is None else index))
    (path / "unet" / "config.json").write_text("{}")
    (path / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(b"w" * 1000)
    (path / "unet" / "diffusion_pytorch_model.bin").write_bytes(b"a pickle: never copied")
    (path / "vae" / "diffusion_pytorch_model.safetensors").write_bytes(b"w" * 500)
    (path / "tokenizer" / "vocab.json").write_text("{}")
    (path / "tokenizer" / "merges.txt").write_text("#version: 0.2\n")
    (path / "scheduler" / "scheduler_config.json").write_text("{}")
    (path / "README.md").write_text("not a component")
    return path


def test_import_copies_the_components_and_no_pickles(store: ModelStore, tmp_path: Path) -> None:
    entry = store.import_local(pipeline_dir(tmp_path / "src"), "acme/tiny-sd")
    assert (entry.id, entry.engine) == ("acme/tiny-sd:default", "diffusers")
    folder = Path(entry.path)
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == [
        "model_index.json", "scheduler/scheduler_config.json", "tokenizer/merges.txt", "tokenizer/vocab.json",
        "unet/config.json", "unet/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors",
    ]  # fmt: skip
    assert store.resolve("acme/tiny-sd").path == entry.path
    # The memory estimate counts the weights in the component folders.
    assert estimate_worker_bytes(entry.path, 0) > 1500


def test_a_repo_holds_one_engine(store: ModelStore, tmp_path: Path) -> None:
    store.import_local(pipeline_dir(tmp_path / "src"), "acme/tiny-sd:fp32")
    onnx = tmp_path / "onnx"
    onnx.mkdir()
    (onnx / "model.onnx").write_bytes(b"\x08\x08")
    (onnx / "tokenizer.json").write_text("{}")
    with pytest.raises(BadRequest, match="already holds diffusers"):
        store.import_local(onnx, "acme/tiny-sd:int8")


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda p: (p / "unet" / "diffusion_pytorch_model.safetensors").unlink()
         or (p / "vae" / "diffusion_pytorch_model.safetensors").unlink(), "no .safetensors"),
        (lambda p: (p / "model_index.json").write_text("{not json"), "not readable JSON"),
        (lambda p: (p / "model_index.json").write_text("[]"), "names no pipeline"),
        (lambda p: (p / "model_index.json").write_text(json.dumps({**INDEX, "text_encoder": ["transformers", "X"]})),
         "text_encoder"),
        (lambda p: (p / "model_index.json").write_text(json.dumps({**INDEX, "../up": ["diffusers", "X"]})), "../up"),
    ],
)  # fmt: skip
def test_refusals(store: ModelStore, tmp_path: Path, spoil, message: str) -> None:  # type: ignore[no-untyped-def]
    src = pipeline_dir(tmp_path / "src")
    spoil(src)
    with pytest.raises(BadRequest, match=message.replace(".", r"\.")):
        store.import_local(src, "acme/tiny-sd")
    assert store.entries() == []
