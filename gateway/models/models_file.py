"""The models file (`--models-file`): per-model aliases, request defaults and lifecycle, in TOML.

One top-level table per installed model id:

    ["HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1"]
    aliases = ["gpt-4o-mini"]
    temperature = 0.0
    nctx = 8192

A file is taken whole or not at all: an unknown key, a bad value, an alias that clashes, or a
table that names no installed model refuses the file with one line naming the file, the table and
the key. The server then does not start (at startup) or keeps the version it read before (a
reload, on SIGHUP or when the file changes on disk). docs/models.md ("Per-model settings") lists
every key.
"""

from __future__ import annotations

import asyncio
import os
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import msgspec
import structlog
from msgspec import Meta

from gateway.errors import GenieXError, ModelNotFound
from protocol import kv_cache
from protocol.chat import ChatMessage, ChatRequest, Compute, GenerationRequest
from protocol.limits import Count, KeepAlive, Layers, PositiveInt, Stop
from protocol.priority import Priority

if TYPE_CHECKING:
    from gateway.models.store import ModelEntry, ModelStore

log = structlog.get_logger("gateway.models.models_file")

R = TypeVar("R", bound=GenerationRequest)

MAX_FILE_BYTES = 1 << 20  # 1 MiB: a larger file is refused unread
MAX_ALIASES = 1000  # in the whole file
MAX_SYSTEM_BYTES = 64 << 10  # a default system prompt, UTF-8
MAX_ALIAS_CHARS = 256
POLL_S = 1.0

KvType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
assert set(KvType.__args__) == set(kv_cache.KV_TYPES), "KvType must list protocol/kv_cache.py's types"  # type: ignore[attr-defined]

# Keys whose change reaches a worker only when it starts.
WORKER_KEYS = ("nctx", "compute", "ngl", "parallel", "cache_type_k", "cache_type_v")
# Keys copied onto a request that leaves them unset, as (file key, request field).
SAMPLING_KEYS = (
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("top_k", "top_k"),
    ("min_p", "min_p"),
    ("repeat_penalty", "repetition_penalty"),
    ("stop", "stop"),
)


class ModelsFileError(ValueError):
    """A models file that cannot be used; the message names the file, and the table and key when one is at fault."""


class ModelSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One table of the file: the model's aliases, the defaults its requests get, and its lifecycle."""

    aliases: list[Annotated[str, Meta(min_length=1, max_length=MAX_ALIAS_CHARS)]] = []
    # request defaults: a request's own field wins
    nctx: Annotated[int, Meta(ge=1, le=1 << 24)] | None = None
    compute: Compute | None = None
    ngl: Layers | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_k: Count | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    repeat_penalty: Annotated[float, Meta(ge=0, le=100)] | None = None
    max_tokens: PositiveInt | None = None
    reasoning: bool | None = None
    priority: Priority | None = None  # its requests' priority where neither the header nor the key says
    system: str | None = None
    stop: Stop | None = None
    # lifecycle
    keep_alive: KeepAlive | None = None
    preload: bool = False
    parallel: Annotated[int, Meta(ge=0, le=256)] | None = None
    cache_type_k: KvType | None = None
    cache_type_v: KvType | None = None
    hidden: bool = False
    disabled: bool = False


class Config(msgspec.Struct, frozen=True):
    """One version of the file, checked: settings by model id, and each alias's model id."""

    tables: dict[str, ModelSettings] = {}
    aliases: dict[str, str] = {}
    table_names: dict[str, str] = {}  # model id -> the table name as written (it may omit the precision)


_PATH_KEY = re.compile(r"^\$\.([A-Za-z_][A-Za-z0-9_]*)")
_AT = re.compile(r"\s*- at `\$[^`]*`$")


def parse(text: str, where: str, store: ModelStore | None) -> Config:
    """`text` (the file at `where`) checked: every refusal is a ModelsFileError naming `where`, and
    the table and key at fault. `store`: the installed models that tables must name (None: any)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ModelsFileError(f"{where}: not valid TOML: {exc}") from None
    tables: dict[str, ModelSettings] = {}
    names: dict[str, str] = {}
    for name, body in doc.items():
        if "\0" in name:
            raise ModelsFileError(f"{where}: table [{name!r}]: a NUL character in a table name")
        if not isinstance(body, dict):
            raise ModelsFileError(f"{where}: `{name}` is not a table: each model is a table, "
                                  f'["org/repo:precision"], with its keys under it')  # fmt: skip
        for key in body:
            if "\0" in key:
                raise ModelsFileError(f"{where}: table [{name}]: key {key!r}: a NUL character in a key")
        try:
            settings = msgspec.convert(body, ModelSettings)
        except msgspec.ValidationError as exc:
            raise ModelsFileError(f"{where}: table [{name}]: {_key_message(str(exc))}") from None
        if settings.system is not None:
            if len(settings.system.encode()) > MAX_SYSTEM_BYTES:
                raise ModelsFileError(f"{where}: table [{name}]: key `system`: the system prompt is more than "
                                      f"{MAX_SYSTEM_BYTES >> 10} KiB")  # fmt: skip
            if "\0" in settings.system:
                raise ModelsFileError(f"{where}: table [{name}]: key `system`: a NUL character in the system prompt")
        model_id = _model_id(name, store, where)
        if model_id in tables:
            raise ModelsFileError(f"{where}: table [{name}]: {model_id} already has a table, "
                                  f"[{names[model_id]}]")  # fmt: skip
        tables[model_id] = settings
        names[model_id] = name
    aliases: dict[str, str] = {}
    total = sum(len(s.aliases) for s in tables.values())
    if total > MAX_ALIASES:
        raise ModelsFileError(f"{where}: {total} aliases, more than the {MAX_ALIASES} a file may hold")
    installed = {e.id.casefold() for e in store.entries()} if store is not None else set()
    targets = {m.casefold(): m for m in tables} | {n.casefold(): m for m, n in names.items()}
    for model_id, settings in tables.items():
        table = names[model_id]
        for alias in settings.aliases:
            if "\0" in alias:
                raise ModelsFileError(f"{where}: table [{table}]: key `aliases`: a NUL character in an alias")
            if alias.strip() != alias:
                raise ModelsFileError(f"{where}: table [{table}]: key `aliases`: {alias!r} has leading or "
                                      "trailing spaces")  # fmt: skip
            folded = alias.casefold()
            if folded in targets:
                other = targets[folded]
                whose = "its own table's" if other == model_id else f"table [{names[other]}]'s"
                raise ModelsFileError(f"{where}: table [{table}]: key `aliases`: {alias!r} is {whose} model id; an "
                                      "alias names a model id, never itself or another alias")  # fmt: skip
            if folded in installed or _names_installed(alias, store):
                raise ModelsFileError(f"{where}: table [{table}]: key `aliases`: {alias!r} is an installed "
                                      "model's id; an alias may not hide a model")  # fmt: skip
            if (seen := aliases.get(folded)) is not None:
                again = "twice" if seen == model_id else f"also in table [{names[seen]}]"
                raise ModelsFileError(f"{where}: table [{table}]: key `aliases`: {alias!r} is {again}; "
                                      "an alias names one model")  # fmt: skip
            aliases[folded] = model_id
    return Config(tables, aliases, names)


def _key_message(message: str) -> str:
    """msgspec's `Expected `int`, got `str` - at `$.nctx`` as `key `nctx`: expected `int`, got `str``."""
    if m := re.match(r"^Object contains unknown field `([^`]+)`", message):
        return f"key `{m.group(1)}`: an unknown key (docs/models.md lists them)"
    at = re.search(r"- at `\$\.([^`]+)`$", message)
    text = _AT.sub("", message).replace(" | null`", "`")
    text = text[:1].lower() + text[1:]
    if at:
        key = _PATH_KEY.match("$." + at.group(1))
        return f"key `{key.group(1) if key else at.group(1)}`: {text}"
    return text


def _model_id(name: str, store: ModelStore | None, where: str) -> str:
    if store is None:
        return name
    try:
        return store.resolve(name, plain=True).id
    except GenieXError as exc:
        raise ModelsFileError(f"{where}: table [{name}]: not an installed model: {exc.message}") from None


def _names_installed(alias: str, store: ModelStore | None) -> bool:
    if store is None or "/" not in alias:
        return False
    try:
        store.resolve(alias, plain=True)
    except GenieXError:
        return False
    return True


def read(path: Path, store: ModelStore | None) -> Config:
    """The file at `path`, read (at most MAX_FILE_BYTES: a larger one is refused unread) and parsed."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE_BYTES:
                raise ModelsFileError(f"{path}: {size} bytes, more than the {MAX_FILE_BYTES >> 20} MiB a models "
                                      "file may hold; not read")  # fmt: skip
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ModelsFileError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ModelsFileError(f"{path}: more than the {MAX_FILE_BYTES >> 20} MiB a models file may hold")
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise ModelsFileError(f"{path}: not UTF-8 (byte {exc.start})") from None
    return parse(text, str(path), store)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class ModelsFile:
    """The models file as the server uses it now: the last version that was valid. `path` None: no file."""

    def __init__(self, path: Path | None = None, store: ModelStore | None = None) -> None:
        self.path = path.expanduser() if path is not None else None
        self.store = store
        self.config = Config()
        # whether a model has a worker loaded now (the server sets it): a change to a worker's settings
        # is logged as one that applies to its next worker only then
        self.loaded: Callable[[str], bool] = lambda _model: True
        self._stamp: tuple[int, int, int] | None = None
        if self.path is not None:
            self._stamp = _stamp(self.path)
            self.config = read(self.path, store)  # at startup a bad file is the caller's error to report

    # ---- reading ---------------------------------------------------------------

    def target(self, name: str) -> str:
        """The model id an alias names, else `name` as given."""
        return self.config.aliases.get(name.casefold(), name)

    def settings_of(self, model_id: str) -> ModelSettings | None:
        return self.config.tables.get(model_id)

    def is_disabled(self, model_id: str) -> bool:
        s = self.config.tables.get(model_id)
        return s is not None and s.disabled

    def check_enabled(self, model_id: str, asked: str) -> None:
        """A ModelNotFound (404) naming the model as disabled, and the file that says so."""
        if self.is_disabled(model_id):
            via = f" (asked as {asked!r})" if asked.casefold() != model_id.casefold() else ""
            raise ModelNotFound(f"model {model_id!r}{via} is disabled by the models file {self.path}",
                                code="model_disabled")  # fmt: skip

    def preloads(self) -> list[str]:
        return [m for m, s in self.config.tables.items() if s.preload and not s.disabled]

    # The four methods of gateway/http/model_facts.py's ModelFacts, which /v1/models reads.

    def aliases(self, model_id: str) -> list[str]:
        """Other names requests may use for the model."""
        s = self.config.tables.get(model_id)
        return list(s.aliases) if s is not None else []

    def defaults(self, model_id: str) -> dict[str, Any]:
        """The settings its table sets, as its requests and workers get them when they set none
        (e.g. {"nctx": 8192, "temperature": 0.0}); aliases, hidden and disabled aside."""
        s = self.config.tables.get(model_id)
        if s is None:
            return {}
        out: dict[str, Any] = msgspec.to_builtins(s)
        for key in ("aliases", "hidden", "disabled"):
            out.pop(key, None)
        return out

    def hidden(self, model_id: str) -> bool:
        """Left out of `GET /v1/models`' list: `hidden` (still served) or `disabled` (refused)."""
        s = self.config.tables.get(model_id)
        return s is not None and (s.hidden or s.disabled)

    def is_hidden(self, model_id: str) -> bool:
        return self.hidden(model_id)

    def source(self, model_id: str) -> str | None:
        """The file and the table the model's aliases and defaults come from; None: no table."""
        if model_id not in self.config.tables:
            return None
        return f"{self.path} [{self.config.table_names.get(model_id, model_id)}]"

    def describe(self, model_id: str) -> dict[str, Any] | None:
        """Aliases, defaults and source in one dict; None when the file has no table for the model."""
        if model_id not in self.config.tables:
            return None
        return {"aliases": self.aliases(model_id), "defaults": self.defaults(model_id),
                "source": self.source(model_id)}  # fmt: skip

    # ---- request defaults ------------------------------------------------------

    def with_defaults(self, req: R, entry: ModelEntry) -> R:
        """`req` with the model's defaults in every field it left unset (its own values win)."""
        s = self.config.tables.get(entry.id)
        if s is None:
            return req
        changes: dict[str, Any] = {}
        for key, field in SAMPLING_KEYS:
            value = getattr(s, key)
            if value is not None and getattr(req, field, None) is None:
                changes[field] = value
        if s.max_tokens is not None and isinstance(req, ChatRequest):  # a text completion's max_tokens is 16 unless set
            if req.max_completion_tokens is None and req.max_tokens is None:
                changes["max_tokens"] = s.max_tokens
        if s.reasoning is not None and getattr(req, "enable_think", True) is None:
            changes["enable_think"] = s.reasoning
        messages: list[ChatMessage] | None = getattr(req, "messages", None)
        if s.system is not None and messages and not any(m.role in ("system", "developer") for m in messages):
            changes["messages"] = [ChatMessage(role="system", content=s.system), *messages]
        return msgspec.structs.replace(req, **changes) if changes else req

    # ---- reloading -------------------------------------------------------------

    def reload(self, why: str = "") -> bool:
        """Read the file again; an invalid version keeps the one before (one warning naming the fault)."""
        if self.path is None:
            return False
        self._stamp = _stamp(self.path)
        try:
            new = read(self.path, self.store)
        except ModelsFileError as exc:
            log.warning("models file not applied; the version read before stays", error=str(exc), why=why)
            return False
        old, self.config = self.config, new
        for model_id, settings in new.tables.items():
            before = old.tables.get(model_id)
            changed = [k for k in WORKER_KEYS if getattr(settings, k) != getattr(before, k, None)]
            if before is not None and changed and self.loaded(model_id):
                log.info("models file: a change that applies to the next worker", model=model_id, keys=changed)
        log.info("models file read again", path=str(self.path), models=len(new.tables), aliases=len(new.aliases),
                 why=why)  # fmt: skip
        return True

    async def watch(self, interval_s: float = POLL_S) -> None:
        """Poll the file's mtime, size and inode, and read it again when they change."""
        if self.path is None:
            return
        while True:
            await asyncio.sleep(interval_s)
            stamp = _stamp(self.path)
            if stamp == self._stamp:
                continue
            if stamp is None:
                log.warning("models file is gone; the version read before stays", path=str(self.path))
                self._stamp = None
                continue
            try:
                self.reload("changed on disk")
            except Exception:  # a bug must not stop the watching; the file's own faults reload logs itself
                log.exception("models file not read again", path=str(self.path))
