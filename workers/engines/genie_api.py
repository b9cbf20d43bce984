"""libGenie, the Qualcomm AI Runtime's LLM library, through ctypes: the few calls the qairt engine
makes, each typed once, and Genie's status codes as one exception.

The library ships in the onnxruntime-qnn wheel beside the QNN backends it loads (libQnnHtp.so on a
Snapdragon; on x86_64 the same name is Qualcomm's HTP simulator). Wire facts, from Genie's C API
headers (GenieCommon.h, GenieDialog.h, GenieSampler.h) and checked against the shipped library:

- every call returns a `Genie_Status_t` (int32): 0 success, positive a warning (1 aborted, 3 paused,
  4 context exceeded), negative an error (-1 general ... -14);
- a dialog is made from a config handle (`GenieDialogConfig_createFromJson` takes the JSON text,
  not a path); `GenieDialog_query(dialog, text, sentence code, callback, user data)` blocks until the
  answer ends, calling back `void(const char* piece, int sentence code, const void* user data)` on
  the calling thread; `GenieDialog_signal(dialog, GENIE_DIALOG_ACTION_ABORT)` ends a running query
  early (its status is then 1);
- `GenieSamplerConfig_createFromJson` takes `{"sampler": {"version": 1, ...}}` and refuses keys its
  schema does not know; `GenieSamplerConfig_setParam` with a NULL key crashes this build, so it is
  never called.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

LIBRARY = "libGenie.so"

SUCCESS = 0
WARNING_ABORTED = 1
WARNING_PAUSED = 3
WARNING_CONTEXT_EXCEEDED = 4
STATUS_NAMES = {
    0: "SUCCESS", 1: "WARNING_ABORTED", 2: "WARNING_BOUND_HANDLE", 3: "WARNING_PAUSED",
    4: "WARNING_CONTEXT_EXCEEDED", -1: "ERROR_GENERAL", -2: "ERROR_INVALID_ARGUMENT", -3: "ERROR_MEM_ALLOC",
    -4: "ERROR_INVALID_CONFIG", -5: "ERROR_INVALID_HANDLE", -6: "ERROR_QUERY_FAILED", -7: "ERROR_JSON_FORMAT",
    -8: "ERROR_JSON_SCHEMA", -9: "ERROR_JSON_VALUE", -10: "ERROR_GENERATE_FAILED", -11: "ERROR_GET_HANDLE_FAILED",
    -12: "ERROR_APPLY_CONFIG_FAILED", -13: "ERROR_SET_PARAMS_FAILED", -14: "ERROR_BOUND_HANDLE",
}  # fmt: skip

# GenieDialog_SentenceCode_t: a query is sent whole; the answer comes back in pieces.
SENTENCE_COMPLETE = 0
SENTENCE_BEGIN = 1
SENTENCE_CONTINUE = 2
SENTENCE_END = 3
SENTENCE_ABORT = 4
ACTION_ABORT = 1  # GenieDialog_Action_t

MAX_SEED = 2**31 - 1  # the sampler schema's bound

Handle = ctypes.c_void_p
QueryCallback = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p)
_Status = ctypes.c_int32
_Out = ctypes.POINTER(ctypes.c_void_p)

# name -> (argument types); every one returns a status. The optional ones are absent from older
# libraries: the engine then does without (no early abort, the bundle's own sampler).
_CALLS: dict[str, list[Any]] = {
    "GenieDialogConfig_createFromJson": [ctypes.c_char_p, _Out],
    "GenieDialogConfig_free": [Handle],
    "GenieDialog_create": [Handle, _Out],
    "GenieDialog_query": [Handle, ctypes.c_char_p, ctypes.c_int, QueryCallback, ctypes.c_void_p],
    "GenieDialog_reset": [Handle],
    "GenieDialog_free": [Handle],
}
_OPTIONAL: dict[str, list[Any]] = {
    "GenieDialog_signal": [Handle, ctypes.c_int],
    "GenieDialog_setMaxNumTokens": [Handle, ctypes.c_uint32],
    "GenieDialog_getSampler": [Handle, _Out],
    "GenieSamplerConfig_createFromJson": [ctypes.c_char_p, _Out],
    "GenieSamplerConfig_free": [Handle],
    "GenieSampler_applyConfig": [Handle, Handle],
}
_SAMPLER_CALLS = ("GenieDialog_getSampler", "GenieSamplerConfig_createFromJson", "GenieSamplerConfig_free",
                  "GenieSampler_applyConfig")  # fmt: skip


class GenieError(Exception):
    """A Genie call that failed: which call, and its status by name."""

    def __init__(self, call: str, status: int, detail: str = "") -> None:
        self.call = call
        self.status = status
        name = STATUS_NAMES.get(status, "UNKNOWN")
        super().__init__(f"{call} failed: GENIE_STATUS_{name} ({status}){f'; {detail}' if detail else ''}")


def library_dir() -> Path:
    """The onnxruntime-qnn wheel's folder: libGenie and the QNN backends it opens."""
    try:
        import onnxruntime_qnn
    except ImportError:
        raise GenieError(LIBRARY, -1, "the onnxruntime-qnn package, which ships it, is not installed") from None
    return Path(onnxruntime_qnn.get_library_path()).parent


class Genie:
    """The loaded library."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or library_dir() / LIBRARY
        # On a Snapdragon, FastRPC finds the Hexagon skel libraries through ADSP_LIBRARY_PATH, read
        # when the HTP backend first opens the NPU: the wheel's own unless the operator set it (the
        # rule workers/engines/onnx.py follows, kept here so this worker never loads onnxruntime).
        if not os.environ.get("ADSP_LIBRARY_PATH"):
            skels = sorted(self.path.parent.rglob("libQnnHtpV*Skel.so"))
            if skels:
                os.environ["ADSP_LIBRARY_PATH"] = str(skels[0].parent)
        try:
            self.lib = ctypes.CDLL(str(self.path))
        except OSError as exc:
            raise GenieError(LIBRARY, -1, f"cannot load {self.path}: {exc}") from None
        self.has: set[str] = set()
        for name, args in (*_CALLS.items(), *_OPTIONAL.items()):
            fn = getattr(self.lib, name, None)
            if fn is None:
                if name in _CALLS:
                    raise GenieError(name, -1, f"{self.path} has no {name}")
                continue
            fn.restype, fn.argtypes = _Status, args
            self.has.add(name)
        for name in ("Genie_getApiMajorVersion", "Genie_getApiMinorVersion", "Genie_getApiPatchVersion"):
            getattr(self.lib, name).restype = ctypes.c_uint32

    def version(self) -> tuple[int, int, int]:
        lib = self.lib
        return (int(lib.Genie_getApiMajorVersion()), int(lib.Genie_getApiMinorVersion()),
                int(lib.Genie_getApiPatchVersion()))  # fmt: skip

    @property
    def can_abort(self) -> bool:
        return "GenieDialog_signal" in self.has

    @property
    def can_sample(self) -> bool:
        return all(name in self.has for name in _SAMPLER_CALLS)

    def call(self, name: str, *args: Any) -> int:
        """Call `name`; its status when it is success or a warning, GenieError when an error."""
        status = int(getattr(self.lib, name)(*args))
        if status < 0:
            raise GenieError(name, status)
        return status

    def dialog_config(self, config_json: bytes) -> ctypes.c_void_p:
        """A dialog config handle from the config's JSON text (free it with GenieDialogConfig_free)."""
        handle = ctypes.c_void_p()
        self.call("GenieDialogConfig_createFromJson", config_json, ctypes.byref(handle))
        return handle

    def sampler_config(self, sampler: dict[str, Any]) -> ctypes.c_void_p:
        """A sampler config handle from the sampler's settings (GenieError when its schema refuses one)."""
        handle = ctypes.c_void_p()
        body = json.dumps({"sampler": {"version": 1, **sampler}}).encode()
        self.call("GenieSamplerConfig_createFromJson", body, ctypes.byref(handle))
        return handle

    def check_sampler(self, sampler: dict[str, Any]) -> None:
        """Whether Genie's schema takes these sampler settings (GenieError naming why not)."""
        self.call("GenieSamplerConfig_free", self.sampler_config(sampler))


def sampler_settings(temperature: float, top_k: int, top_p: float, seed: int, n_vocab: int = 0) -> dict[str, Any]:
    """A request's sampling as Genie's sampler takes it: `temp`, `top-k`, `top-p`, `seed`, and
    `greedy` for temperature 0; top-k 0 (no limit) as the whole vocabulary when the bundle says its size."""
    out: dict[str, Any] = {"seed": seed % (MAX_SEED + 1), "top-p": min(max(top_p, 0.0), 1.0)}
    if temperature <= 0:
        out.update(greedy=True, temp=1.0)
    else:
        out.update(greedy=False, temp=temperature)
    if top_k > 0:
        out["top-k"] = top_k
    elif n_vocab > 0:
        out["top-k"] = n_vocab
    return out


class GenieDialog:
    """One dialog: the model loaded on the NPU, and the conversation in its KV cache. Only `abort`
    may be called from another thread than the one running `query`."""

    def __init__(self, genie: Genie, config_json: bytes) -> None:
        self.genie = genie
        self.config = genie.dialog_config(config_json)
        self.handle = ctypes.c_void_p()
        try:
            genie.call("GenieDialog_create", self.config, ctypes.byref(self.handle))
        except GenieError:
            genie.call("GenieDialogConfig_free", self.config)
            raise
        self.can_abort = genie.can_abort
        self.can_sample = genie.can_sample

    def query(self, prompt: str, on_piece: Callable[[bytes, int], None]) -> int:
        """Run one query to its end, `on_piece(piece, sentence code)` per piece of the answer; the
        final status (success or a warning). An exception in `on_piece` aborts the query and is
        raised here (ctypes would otherwise print it and carry on)."""
        raised: list[BaseException] = []

        def piece(response: bytes | None, code: int, _user: int | None) -> None:
            if raised:
                return
            try:
                on_piece(response or b"", code)
            except BaseException as exc:  # noqa: BLE001 - re-raised after the query returns
                raised.append(exc)
                self.abort()

        callback = QueryCallback(piece)  # referenced until the call returns: Genie holds only the pointer
        status = self.genie.call("GenieDialog_query", self.handle, prompt.encode(), SENTENCE_COMPLETE, callback, None)
        if raised:
            raise raised[0]
        return status

    def abort(self) -> None:
        if self.can_abort:
            self.genie.call("GenieDialog_signal", self.handle, ACTION_ABORT)

    def reset(self) -> None:
        self.genie.call("GenieDialog_reset", self.handle)

    def set_max_tokens(self, n: int) -> None:
        if "GenieDialog_setMaxNumTokens" in self.genie.has:
            self.genie.call("GenieDialog_setMaxNumTokens", self.handle, max(1, min(n, 2**32 - 1)))

    def set_sampler(self, sampler: dict[str, Any]) -> None:
        """Use these sampler settings from the next query on (sampler_settings makes them)."""
        if not self.can_sample:
            return
        target = ctypes.c_void_p()
        self.genie.call("GenieDialog_getSampler", self.handle, ctypes.byref(target))
        config = self.genie.sampler_config(sampler)
        try:
            self.genie.call("GenieSampler_applyConfig", target, config)
        finally:
            self.genie.call("GenieSamplerConfig_free", config)

    def close(self) -> None:
        if self.handle:
            self.genie.call("GenieDialog_free", self.handle)
            self.handle = ctypes.c_void_p()
        if self.config:
            self.genie.call("GenieDialogConfig_free", self.config)
            self.config = ctypes.c_void_p()


@functools.cache
def genie() -> Genie:
    """The library, loaded once per process."""
    return Genie()


def open_dialog(config_json: bytes) -> GenieDialog:
    """A dialog made from a bundle's config (protocol/genie_bundle.py: loadable_config)."""
    return GenieDialog(genie(), config_json)
