"""Request bodies decoded strictly into their protocol structs.

Litestar converts a `data: Struct` body leniently (strict=False, since query strings need it):
`"max_tokens": "3"`, `"stream": "false"` and `"last_only": 0` all passed as their typed values,
where the spec and OpenAI refuse them. Handlers take the raw `body` and decode it here instead;
a refusal is the same ValidationException (so the same 400 message) that Litestar raises.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec
import msgspec.inspect as mi
from litestar.exceptions import ValidationException

T = TypeVar("T")

# msgspec ends a message with the path of the offending value: "... - at `$.messages[0].role`".
_AT = re.compile(r"^(?P<message>.*?)(?: - at `\$\.?(?P<key>[^`]*)`)?$", re.DOTALL)
_STEP = re.compile(r"\.?([^.\[\]]+)|\[(\d+)\]")


def validation_error(exc: msgspec.ValidationError, kind: Any = None) -> ValidationException:
    """msgspec's refusal as Litestar's, so that it reads as the same 400 naming the field; where the
    field (in `kind`, the decoded type) takes a fixed set of values, naming them too."""
    m = _AT.match(str(exc))
    assert m is not None  # the pattern matches any text
    message = m["message"]
    if kind is not None and m["key"] and (values := allowed_values(kind, m["key"])):
        message += f" (one of {', '.join(f'`{v}`' for v in values)})"
    return ValidationException(extra=[{"key": m["key"] or None, "message": message, "source": "body"}])


def _alternatives(t: mi.Type) -> list[mi.Type]:
    if isinstance(t, mi.UnionType):
        return [a for u in t.types for a in _alternatives(u)]
    if isinstance(t, mi.Metadata):
        return _alternatives(t.type)
    return [t]


def allowed_values(kind: Any, key: str) -> tuple[Any, ...]:
    """The values of the Literal at `key` (msgspec's path in `kind`: `messages[0].role`); () when
    the field there is no Literal (or the path leads nowhere)."""
    try:
        t: mi.Type | None = mi.type_info(kind)
    except (TypeError, ValueError):
        return ()
    for name, index in _STEP.findall(key):
        found: mi.Type | None = None
        for alt in _alternatives(t) if t is not None else []:
            if name and isinstance(alt, mi.StructType):
                found = next((f.type for f in alt.fields if f.encode_name == name), None)
            elif index and isinstance(alt, mi.ListType | mi.VarTupleType):
                found = alt.item_type
            if found is not None:
                break
        t = found
    return next((a.values for a in _alternatives(t) if isinstance(a, mi.LiteralType)), ()) if t is not None else ()


def read_json(body: bytes, kind: type[T]) -> T:
    """`body` as a `kind`, or a ValidationException naming the field that is wrong."""
    if not body.strip():
        raise ValidationException("the body is empty; a JSON object is expected")
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise validation_error(exc, kind) from None
    except msgspec.DecodeError as exc:
        raise ValidationException(f"the body is not JSON: {exc}") from None
    except RecursionError:
        # Python's recursion limit bounds msgspec's nesting: about 1000 levels, far past any request.
        raise ValidationException("the JSON body nests too deeply") from None
