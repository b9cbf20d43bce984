"""`/v1/cv`: the request and response bodies, and the bounds on the image a request may send.

The spec's CVRequest is `{model, image}`, `image` being base64, a `data:` URL or an http(s) URL
(fetched only from hosts the operator allows); its CVResponse is `{results: [{label, confidence,
bbox: {x, y, width, height}}]}`. With an OCR model each result is one line of text: `label` is
what it reads, `confidence` the recogniser's (0..1), and `bbox` the box around it in the image's
pixels, origin top left. `compute` picks the unit per request, as chat's does (a GenieX extension).
"""

from __future__ import annotations

import msgspec

from protocol.chat import Compute

# An image is decoded only when its header says it has at most this many pixels: a small file can
# claim a huge canvas (a decompression bomb), and this bounds what decoding it may cost.
MAX_IMAGE_PIXELS = 40_000_000
# RapidOCR's detector scales an image's short side up to 736 pixels, so a thin image becomes a huge
# canvas (a 100 x 2000 one, 736 x 14720). A wide one is padded back to at most 4:1 first, which
# holds to about 100:1; a tall one is not, so it may be at most 10 times as high as it is wide
# (a detector canvas of at most about 5.4 megapixels, against about 4 for a 2000 x 2000 photo).
MAX_WIDE_RATIO = 100
MAX_TALL_RATIO = 10


class CVRequest(msgspec.Struct, kw_only=True):
    model: str
    image: str
    user: str | None = None
    compute: Compute | None = None


class BBox(msgspec.Struct):
    x: float
    y: float
    width: float
    height: float


class CVResult(msgspec.Struct):
    label: str
    confidence: float
    bbox: BBox


class CVResponse(msgspec.Struct):
    results: list[CVResult]
