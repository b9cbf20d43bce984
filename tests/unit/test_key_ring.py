"""API keys: the key file, constant-time checks, labels that never show the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.ops.keys import KeyFileError, KeyRing, default_label, parse_key_file


def test_the_key_file_takes_keys_labels_and_comments() -> None:
    text = "# team keys\nsk-alice-0123456789 alice\n\nsk-bob-0123456789   # no label\n"
    assert [row[:2] for row in parse_key_file(text)] == [
        ("sk-alice-0123456789", "alice"),
        ("sk-bob-0123456789", default_label("sk-bob-0123456789")),
    ]
    with pytest.raises(KeyFileError, match="line 1"):
        parse_key_file("short")


def test_keys_are_checked_and_named_by_label(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("sk-alice-0123456789 alice\n")
    ring = KeyRing(["sk-flag-0123456789"], f)
    assert ring.enabled
    assert ring.check("sk-alice-0123456789").label == "alice"  # type: ignore[union-attr]
    assert ring.check("sk-flag-0123456789").label.startswith("key-")  # type: ignore[union-attr]
    assert ring.check("sk-alice-012345678") is None and ring.check("") is None
    assert "0123456789" not in default_label("sk-flag-0123456789")
    f.write_text("sk-carol-0123456789 carol\n")
    ring.reload()
    assert ring.check("sk-alice-0123456789") is None and ring.check("sk-carol-0123456789").label == "carol"  # type: ignore[union-attr]
    assert not KeyRing([]).enabled


def test_a_keys_priority_is_read_and_a_bad_one_named() -> None:
    from gateway.ops.keys import parse_key_lines

    (agent, person) = parse_key_lines("agent-key-1 agent priority=background\nperson-key-1 person\n")
    assert agent.priority == "background" and person.priority is None
    with pytest.raises(KeyFileError, match="line 1: 'priority=urgent': `priority` is one of interactive, normal"):
        parse_key_lines("agent-key-1 agent priority=urgent")
