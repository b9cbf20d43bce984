"""POST /v1/images/generations through the real server, worker and diffusers pipeline, driven by
the official `openai` SDK (`client.images.generate`).

The model is SYNTHETIC (tests/image_models.py): a tiny Stable Diffusion pipeline with random
weights and CLIP's real tokenizer, written with diffusers' `save_pretrained` and imported with
the real `geniex pull --local DIR`. Its images depict nothing; what is checked is the mechanics:
PNGs of the requested size and count, the seed extension, the bounds, and cancellation.
"""

from __future__ import annotations

import base64
import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from tests.conftest import MODEL as CHAT_MODEL
from tests.image_models import pulled_tiny_sd
from tests.server_proc import ServerProcess

PROMPT = "a red cat on a blue sofa"
FAST = {"num_inference_steps": 2}  # GenieX extension: the synthetic model needs no more


@pytest.fixture(scope="module")
def model(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The synthetic pipeline, pulled into the shared server's store (which reads it at once);
    its worker (torch: hundreds of MB) is unloaded after the module."""
    name = pulled_tiny_sd(tmp_path_factory.mktemp("tiny-sd"), server.data_dir)
    yield name
    httpx.post(f"{server.base_url}/v1/models/unload", json={"model": name}, timeout=60)


def png(b64: str | None) -> Image.Image:
    assert b64 is not None
    data = base64.b64decode(b64, validate=True)
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    image.load()
    return image


def pixels(b64: str | None) -> np.ndarray:
    return np.asarray(png(b64).convert("RGB"), dtype=np.int16)


def post(server: ServerProcess, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/images/generations", json=body, timeout=300)


def test_n_pngs_of_the_requested_size(client: openai.OpenAI, model: str) -> None:
    r = client.images.generate(model=model, prompt=PROMPT, n=2, size="256x256", response_format="b64_json",
                               quality="standard", style="natural", user="tester", extra_body=FAST)  # fmt: skip
    assert isinstance(r.created, int) and r.created > 0
    assert r.data is not None and len(r.data) == 2
    for item in r.data:
        assert png(item.b64_json).size == (256, 256)
        assert item.revised_prompt == PROMPT  # a prompt the text encoder reads whole is not revised
    # Without a seed, every image has its own noise.
    assert np.abs(pixels(r.data[0].b64_json) - pixels(r.data[1].b64_json)).mean() > 5


def test_width_and_height_as_the_size_says(client: openai.OpenAI, model: str) -> None:
    r = client.images.generate(model=model, prompt=PROMPT, size="1024x1792", extra_body={"num_inference_steps": 1})
    assert r.data is not None and len(r.data) == 1
    assert png(r.data[0].b64_json).size == (1024, 1792)  # PIL: (width, height)


def test_a_seed_makes_images_reproducible(client: openai.OpenAI, model: str) -> None:
    def make(seed: int, n: int = 1) -> list[np.ndarray]:
        r = client.images.generate(model=model, prompt=PROMPT, n=n, extra_body={**FAST, "seed": seed})
        assert r.data is not None
        return [pixels(d.b64_json) for d in r.data]

    first, again, other = make(7)[0], make(7)[0], make(8)[0]
    # Same seed, same image (a level of slack for float sums that a changed thread count reorders).
    assert np.abs(first - again).max() <= 2
    assert np.abs(first - other).mean() > 5
    # Image i of a request uses seed + i.
    pair = make(7, n=2)
    assert np.abs(pair[0] - first).max() <= 2
    assert np.abs(pair[1] - other).max() <= 2


def test_a_long_prompt_is_revised_to_what_the_encoder_read(client: openai.OpenAI, model: str) -> None:
    long = " ".join(["a red cat"] * 60)  # 180 words; CLIP reads 77 tokens with its two markers
    r = client.images.generate(model=model, prompt=long, extra_body=FAST)
    assert r.data is not None
    revised = r.data[0].revised_prompt
    assert revised and len(revised) < len(long) and long.startswith(revised)


def test_the_model_lists_its_capability(client: openai.OpenAI, model: str) -> None:
    listed = client.models.retrieve(model).model_dump()
    assert listed["engine"] == "diffusers"
    assert listed["capabilities"] == ["images"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"n": 0}, "n"),
        ({"n": 11}, "n"),
        ({"size": "300x300"}, "size"),
        ({"size": "64x64"}, "size"),
        ({"prompt": "x" * 1001}, "prompt"),
        ({"prompt": "   "}, "prompt"),
        ({"quality": "ultra"}, "quality"),
        ({"style": "noir"}, "style"),
        ({"response_format": "url"}, "response_format"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
        ({"num_inference_steps": 151}, "num_inference_steps"),
        ({"guidance_scale": -1}, "guidance_scale"),
        ({"seed": -1}, "seed"),
        ({"negative_prompt": "x" * 1001}, "negative_prompt"),
        ({"n": "2"}, "n"),
        # 10 images of 1792x1024 at hd's 50 steps: 3,500 steps of a 512x512 image, over the bound.
        ({"n": 10, "size": "1792x1024", "quality": "hd"}, "too much work"),
    ],
)
def test_bad_parameters_are_400s_naming_them(server: ServerProcess, model: str, change: dict, field: str) -> None:
    r = post(server, {"model": model, "prompt": PROMPT, **change})
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]


def test_the_sdk_sees_a_bad_request(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError):
        client.images.generate(model=model, prompt=PROMPT, n=11)


def test_an_unknown_model_is_404(client: openai.OpenAI, server: ServerProcess) -> None:
    with pytest.raises(openai.NotFoundError):
        client.images.generate(model="nobody/no-such-model", prompt=PROMPT)
    assert "error" in post(server, {"model": "nobody/no-such-model", "prompt": PROMPT}).json()


def test_a_model_of_another_kind_is_400(server: ServerProcess, model: str) -> None:
    r = post(server, {"model": CHAT_MODEL, "prompt": PROMPT})
    assert r.status_code == 400
    assert "images" in r.json()["error"] and model in r.json()["error"]  # names the models that can
    r = post(server, {"prompt": PROMPT})
    assert r.status_code == 400 and "`model` is required" in r.json()["error"]


def test_a_client_leaving_cancels_the_work(server: ServerProcess, client: openai.OpenAI, model: str) -> None:
    client.images.generate(model=model, prompt=PROMPT, extra_body={"num_inference_steps": 1})  # loaded
    # 10 images of 150 steps: minutes of work, unless the client's leaving stops it.
    body = {"model": model, "prompt": PROMPT, "n": 10, "num_inference_steps": 150}
    gone = threading.Event()

    def leave_early() -> None:
        try:
            httpx.post(f"{server.base_url}/v1/images/generations", json=body, timeout=3)
        except httpx.TimeoutException:
            gone.set()

    t = threading.Thread(target=leave_early)
    t.start()
    t.join()
    assert gone.is_set(), "the request ended before the client left"
    deadline = time.monotonic() + 60  # a bound on waiting, not a speed claim
    while "image generation cancelled" not in server.log():
        assert time.monotonic() < deadline, "the worker did not stop the images"
        time.sleep(0.2)
    # The worker serves the next request.
    r = client.images.generate(model=model, prompt=PROMPT, extra_body={"num_inference_steps": 1})
    assert r.data is not None and len(r.data) == 1


def test_pull_refuses_a_pipeline_without_safetensors(tmp_path: Path, server: ServerProcess) -> None:
    """An import is checked before anything is copied (store rules in tests/unit/test_store_diffusers.py)."""
    from tests.embedding_models import geniex

    src = tmp_path / "pickled"
    (src / "unet").mkdir(parents=True)
    (src / "model_index.json").write_text(
        '{"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"]}'
    )
    (src / "unet" / "diffusion_pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(RuntimeError, match="safetensors"):
        geniex("pull", "--local", str(src), "test/pickled", "--data-dir", str(server.data_dir))
