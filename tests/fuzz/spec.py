"""The API spec the fuzzer generates from: ../shared/spec as written (the copy in contract/), plus
this server's deliberate deviations from it, each one named and explained here rather than hidden
in the checks.

`openapi-current.yaml` gives chat completions, logits and models; the earlier full spec (only as
flattened text, transcribed in earlier.yaml) gives embeddings, reranking and computer vision. The
earlier spec's audio and image endpoints are served and tested in tests/integration (test_speech.py,
test_transcriptions.py, test_diarize.py, test_images.py), not fuzzed here; /v1/cv is fuzzed.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
EARLIER = HERE / "earlier.yaml"

# The schemas of request bodies: where a client's null is read as "absent" (deviation 1).
REQUEST_SCHEMAS = (
    "ChatCompletionRequest",
    "ChatMessage",
    "ChatMessageContent",
    "ChatMessageImageURL",
    "ChatMessageAudioURL",
    "ChatCompletionTool",
    "ChatCompletionToolFunction",
    "ChatCompletionMessageToolCall",
    "ChatCompletionMessageToolCallFunction",
    "ChatCompletionMessageFunctionCall",
    "ForwardLogitsRequest",
    "EmbeddingRequest",
    "RerankingRequest",
)

Schema = dict[str, Any]


# The API contract as the project keeps it: a copy of ../shared/spec, so that a clone on its own
# runs these tests too; tests/unit/test_contract_copy.py fails when the copy and the original differ.
CONTRACT = HERE / "contract"
SHARED = REPO.parent / "shared" / "spec"


def spec_dir() -> Path:
    """The project's copy of the API spec, or $GENIEX_SPEC_DIR."""
    return Path(os.environ.get("GENIEX_SPEC_DIR") or CONTRACT)


def load_spec() -> Schema:
    """The current spec with the earlier spec's embeddings and reranking, deviations applied."""
    current = spec_dir() / "openapi-current.yaml"
    spec: Schema = yaml.safe_load(current.read_text())
    earlier: Schema = yaml.safe_load(EARLIER.read_text())
    spec["paths"].update(earlier["paths"])
    spec["components"]["schemas"].update(earlier["components"]["schemas"])
    apply_deviations(spec["components"]["schemas"])
    return spec


def apply_deviations(schemas: dict[str, Schema]) -> None:
    """Where this server deliberately differs from the spec's letter."""
    # 1. An optional field sent as null means "absent", as the OpenAI SDKs and most clients send
    #    unset fields; the spec (OpenAPI 3.0, no `nullable`) would have null refused.
    for name in REQUEST_SCHEMAS:
        schema = schemas[name]
        required = set(schema.get("required", []))
        for prop, sub in schema.get("properties", {}).items():
            if prop not in required:
                sub["nullable"] = True
                if "enum" in sub and None not in sub["enum"]:
                    sub["enum"].append(None)  # OpenAPI 3.0: an enum must list null for nullable to admit it

    # 2. A message may carry no content: an assistant turn that only calls tools has none (OpenAI's
    #    shape), and an answer that calls tools says `content: null`. The spec requires content.
    message = schemas["ChatMessage"]
    message["required"] = ["role"]
    message["properties"]["content"]["nullable"] = True
    # 3. OpenAI's newer and older role names are accepted too.
    message["properties"]["role"]["enum"] += ["developer", "function"]

    # 4. Parts of a message that mean nothing without their key are refused without it, as OpenAI
    #    does: a tool call needs its id and function, a function call its name and arguments, a
    #    tool its function, a content part its type, an image its url. The spec requires none.
    for name, keys in (
        ("ChatCompletionMessageToolCall", ["id", "function"]),
        ("ChatCompletionMessageToolCallFunction", ["name", "arguments"]),
        ("ChatCompletionMessageFunctionCall", ["name", "arguments"]),
        ("ChatCompletionTool", ["function"]),
        ("ChatMessageContent", ["type"]),
        ("ChatMessageImageURL", ["url"]),
    ):
        schemas[name]["required"] = keys
        for key in keys:
            schemas[name]["properties"][key].pop("nullable", None)

    # 5. `spec_type: ""` disables speculation, as the field's description says; its enum lacks "".
    schemas["ChatCompletionRequest"]["properties"]["spec_type"]["enum"].append("")

    # 6. `nctx: 0` means the server's default, as the spec's own example sends it (its schema says
    #    minimum 1); `compute` is read in any case.
    schemas["ChatCompletionRequest"]["properties"]["nctx"]["minimum"] = 0
    for name in ("ChatCompletionRequest", "ForwardLogitsRequest", "EmbeddingRequest", "RerankingRequest"):
        compute = schemas[name]["properties"].get("compute")
        if compute is not None:
            compute.pop("enum", None)
            compute["pattern"] = "^([cC][pP][uU]|[gG][pP][uU]|[nN][pP][uU]|[hH][yY][bB][rR][iI][dD])$"

    # 7. Answers carry `logprobs: null` when none were asked for, as OpenAI's do.
    schemas["ChatChoice"]["properties"]["logprobs"]["nullable"] = True


def pristine(spec: Schema) -> Schema:
    """A copy to hand to schemathesis, which may annotate what it is given."""
    return copy.deepcopy(spec)
