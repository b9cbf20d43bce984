"""What the pull routes take as a model name (gateway/models/pull_names.py), and which pulls are one."""

from __future__ import annotations

import pytest

from gateway.errors import BadRequest
from gateway.models.pull_names import pull_key, pull_name
from protocol.pull import PullProgress, status_of


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("acme/Tiny-GGUF", "acme/Tiny-GGUF"),
        ("acme/Tiny-GGUF:Q4_K_M", "acme/Tiny-GGUF:Q4_K_M"),
        ("  acme/Tiny-GGUF:q8_0 ", "acme/Tiny-GGUF:q8_0"),
        ("hf.co/acme/Tiny-GGUF:Q4_K_M", "acme/Tiny-GGUF:Q4_K_M"),
        ("HF.CO/acme/Tiny-GGUF", "acme/Tiny-GGUF"),
        ("huggingface.co/acme/Tiny-GGUF:IQ4_XS", "acme/Tiny-GGUF:IQ4_XS"),
        ("hf.co/acme/Tiny-GGUF:latest", "acme/Tiny-GGUF"),
        ("acme/Tiny-GGUF:LATEST", "acme/Tiny-GGUF"),
    ],
)
def test_hugging_face_names_in_our_form_and_ollamas(raw: str, name: str) -> None:
    assert pull_name(raw) == name


def test_an_ollama_library_name_is_refused_with_the_form_to_use() -> None:
    for raw in ("llama3.2", "llama3.2:latest", "qwen3:8b", "hf.co/llama3.2"):
        with pytest.raises(BadRequest, match=r"Ollama library name.*hf\.co/org/repo:QUANT"):
            pull_name(raw)


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "   ",
        "../../etc",
        "../../etc/passwd",
        "acme/..",
        "acme/.hidden",
        "./x",
        "acme/../../x",
        "hf.co/../../etc:Q4_0",
        "http://evil/x",
        "https://huggingface.co/acme/Tiny-GGUF",
        "file:///etc/passwd",
        "acme/Tiny\x00-GGUF",
        "acme/Tiny-GGUF\n",  # stripped, yet a control character inside is refused:
        "acme/Ti\nny",
        "acme/Tiny GGUF",
        "acme/Tiny-GGUF:Q4:0",
        "a/b/c",
        "/abs/path",
        "acme\\Tiny",
        "acme/" + "x" * 10_000 + "\x01",
    ],
)
def test_hostile_names_are_a_400(raw: str) -> None:
    if raw == "acme/Tiny-GGUF\n":
        assert pull_name(raw) == "acme/Tiny-GGUF"
        return
    with pytest.raises(BadRequest):
        pull_name(raw)


def test_pulls_of_one_model_share_a_key() -> None:
    assert pull_key("acme/Tiny-GGUF:q4_0") == pull_key("acme/Tiny-GGUF:Q4_0")
    assert pull_key("acme/Tiny-GGUF") != pull_key("acme/Tiny-GGUF:Q4_0")
    assert pull_key("acme/Tiny-GGUF") != pull_key("acme/Other-GGUF")


def test_progress_is_worded_as_ollama_words_it() -> None:
    digest = "sha256:" + "0123456789ab" + "f" * 52
    assert status_of(PullProgress("manifest")).status == "pulling manifest"
    line = status_of(PullProgress("downloading", "m.gguf", digest, 10, 4))
    assert (line.status, line.digest, line.total, line.completed, line.file) == (
        "pulling 0123456789ab",
        digest,
        10,
        4,
        None,
    )
    assert status_of(PullProgress("downloading", "m.gguf", digest, 10, 4), with_file=True).file == "m.gguf"
    assert status_of(PullProgress("downloading", "m.gguf", "", 10, 4)).status == "pulling m.gguf"
    assert [status_of(PullProgress(p)).status for p in ("verifying", "writing", "success")] == [
        "verifying sha256 digest",
        "writing manifest",
        "success",
    ]
