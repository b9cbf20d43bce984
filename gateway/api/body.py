"""Request bodies decoded strictly into their protocol structs.

Litestar converts a `data: Struct` body leniently (strict=False, since query strings need it):
`"max_tokens": "3"`, `"stream": "false"` and `"last_only": 0` all passed as their typed values,
where the spec and OpenAI refuse them. Handlers take the raw `body` and decode it here instead;
a refusal is the same ValidationException (so the same 400 message) that Litestar raises.
"""

from __future__ import annotations

import re
from typing import TypeVar

import msgspec
from litestar.exceptions import ValidationException

T = TypeVar("T")

# msgspec ends a message with the path of the offending value: "... - at `$.messages[0].role`".
_AT = re.compile(r"^(?P<message>.*?)(?: - at `\$\.?(?P<key>[^`]*)`)?$", re.DOTALL)


def validation_error(exc: msgspec.ValidationError) -> ValidationException:
    """msgspec's refusal as Litestar's, so that it reads as the same 400 naming the field."""
    m = _AT.match(str(exc))
    assert m is not None  # the pattern matches any text
    return ValidationException(extra=[{"key": m["key"] or None, "message": m["message"], "source": "body"}])


def read_json(body: bytes, kind: type[T]) -> T:
    """`body` as a `kind`, or a ValidationException naming the field that is wrong."""
    if not body.strip():
        raise ValidationException("the body is empty; a JSON object is expected")
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise validation_error(exc) from None
    except msgspec.DecodeError as exc:
        raise ValidationException(f"the body is not JSON: {exc}") from None
    except RecursionError:
        # Python's recursion limit bounds msgspec's nesting: about 1000 levels, far past any request.
        raise ValidationException("the JSON body nests too deeply") from None
