"""earlier.yaml is a faithful transcription: each path and schema in it, comments dropped and
whitespace collapsed, appears verbatim in the flattened earlier spec it was read from."""

from __future__ import annotations

import re

from tests.fuzz.spec import EARLIER, spec_dir


def _blocks(text: str, indent: int) -> dict[str, str]:
    """The blocks that start at `indent` spaces: key line and what is nested below it."""
    blocks: dict[str, list[str]] = {}
    key = None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        depth = len(line) - len(line.lstrip())
        if depth < indent:
            key = None
        elif depth == indent:
            key = line.strip()
            blocks[key] = [line]
        elif key is not None:
            blocks[key].append(line)
    return {k: " ".join(" ".join(v).split()) for k, v in blocks.items()}


def test_every_path_and_schema_is_in_the_earlier_spec() -> None:
    flat = " ".join((spec_dir() / "openapi-full-earlier.flat.txt").read_text().split())
    text = EARLIER.read_text()
    paths, schemas = text.split("\ncomponents:\n")
    blocks = {**_blocks(paths, 2), **_blocks(schemas, 4)}
    assert len(blocks) >= 4, blocks.keys()
    for key, block in blocks.items():
        assert block in flat, f"{key} is not as the earlier spec has it"
    assert re.search(r"/v1/embeddings:", flat) and re.search(r"/v1/reranking:", flat)
