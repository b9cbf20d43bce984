"""The OCR engine's own pieces that need no model run: image decoding and its bounds, finding the
graphs in a model folder, and turning RapidOCR's quadrilaterals into boxes."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rapidocr", reason="the OCR engine comes with the vision extra")

from PIL import Image
from rapidocr.utils.output import RapidOCROutput

from protocol.cv import MAX_IMAGE_PIXELS
from workers.engines import EngineError
from workers.engines.ocr import decode_image, model_graphs, text_regions


def encoded(img: Image.Image, fmt: str = "PNG", **save: object) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **save)
    return out.getvalue()


def refusal(data: bytes) -> str:
    with pytest.raises(EngineError) as err:
        decode_image(data)
    return err.value.message


def test_a_bomb_is_refused_from_its_header() -> None:
    data = encoded(Image.new("1", (8000, 6000)))  # 48 megapixels in a few kilobytes
    assert 8000 * 6000 > MAX_IMAGE_PIXELS and len(data) < 100_000
    assert "8000x6000" in refusal(data)


@pytest.mark.parametrize(
    ("size", "ok"), [((1000, 10), True), ((2000, 10), False), ((30, 300), True), ((30, 301), False)]
)
def test_aspect_ratio_bounds(size: tuple[int, int], ok: bool) -> None:
    data = encoded(Image.new("L", size, 255))
    if ok:
        assert decode_image(data).size == size
    else:
        assert f"{size[0]}x{size[1]}" in refusal(data)


def test_only_common_formats_are_read() -> None:
    assert "could not be read" in refusal(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n")  # Ghostscript's
    assert "could not be read" in refusal(b"\x00" * 64)
    assert "could not be decoded" in refusal(encoded(Image.new("RGB", (64, 64), "red"))[:80])
    assert "empty" in refusal(b"")


def test_modes_become_rgb_or_rgba_and_exif_turns_it_upright() -> None:
    assert decode_image(encoded(Image.new("P", (8, 8)))).mode == "RGB"
    assert decode_image(encoded(Image.new("I;16", (8, 8)))).mode == "RGB"
    assert decode_image(encoded(Image.new("LA", (8, 8)))).mode == "RGBA"
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: the camera was turned; the picture is shown rotated 90°
    turned = decode_image(encoded(Image.new("RGB", (40, 20)), "JPEG", exif=exif.tobytes()))
    assert turned.size == (20, 40)


def test_model_graphs(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="no det and no rec model"):
        model_graphs(tmp_path)
    for name in ("PP-OCRv6_det_small.onnx", "PP-OCRv6_rec_small.onnx", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    assert set(model_graphs(tmp_path)) == {"det", "rec"}  # the classifier is optional
    (tmp_path / "other_det.onnx").write_bytes(b"")
    with pytest.raises(EngineError, match="several det models"):
        model_graphs(tmp_path)


def test_quadrilaterals_become_boxes_inside_the_image() -> None:
    out = RapidOCROutput(
        boxes=np.array(
            [[[10, 5], [110, 7], [109, 40], [9, 38]], [[-3, 50], [130, 50], [130, 80], [-3, 80]]], dtype=np.float32
        ),
        txts=("first", "second"),
        scores=(0.98765, 0.5),
    )
    regions = text_regions(7, 120, 100, out).regions
    assert [(r.text, r.confidence, r.x, r.y, r.width, r.height) for r in regions] == [
        ("first", 0.9877, 9.0, 5.0, 101.0, 35.0),
        ("second", 0.5, 0.0, 50.0, 120.0, 30.0),  # clipped to the image
    ]
    assert text_regions(7, 120, 100, RapidOCROutput()).regions == []
