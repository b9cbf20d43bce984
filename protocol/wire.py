"""Messages between the gateway and a worker: two tagged unions, msgpack-encoded.

Gateway -> worker: Generate, CountTokens, Tokenize, Detokenize, Logits, Embed, Rerank, Recognize, Transcribe, Diarize,
Speak, GenerateImages, Warmup, Cancel, Shutdown, SetThreads.
Worker -> gateway: Ready, Started, Delta, Done, Failed, TokenCount, TokenList, Text, LogitRows, Embeddings, Scores,
TextRegions, Transcript, Diarization, Audio, Images, Dying, Beat (the heartbeat).

Hot-path structs are `array_like` (no field names on the wire) and `gc=False`.
No pickle crosses the boundary: decoders are typed, so anything else is refused.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

import msgspec

from protocol.priority import Priority

PROTOCOL_VERSION = 10
# The data dir's folder of the chat workers' saved prompt states (workers/engines/llama/disk_cache.py).
PROMPT_CACHE_DIR = "prompt-cache"

# The speculation types a worker implements; the gateway refuses every other before sending.
SpecType = Literal["ngram-simple", "ngram-map-k", "draft-simple"]
NGRAM_SPEC_TYPES: tuple[SpecType, ...] = ("ngram-simple", "ngram-map-k")
DRAFT_MODEL_SPEC_TYPES: tuple[SpecType, ...] = ("draft-simple",)


class ErrorKind(enum.IntEnum):
    """Why a worker refused or failed a request; the gateway maps each to an HTTP status."""

    BAD_REQUEST = 1  # the input can never be served (too long, bad grammar, bad token id)
    UNSUPPORTED = 2  # this model does not do this kind of request
    OVERLOADED = 3  # try again later
    ENGINE = 4  # the engine failed
    UPSTREAM = 5  # a remote server the model lives on failed or cannot be reached (502)
    UPSTREAM_TIMEOUT = 6  # that server did not answer in time (504)


class Sampling(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    """Sampler settings for one sequence; `temperature == 0` means greedy."""

    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int | None = None


class Speculation(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    """Speculative decoding for one request, validated by the gateway.

    `type` is one the worker implements (ngram-simple, ngram-map-k, draft-simple);
    `n_min`/`p_min` of 0 mean "no lower bound"; `draft_path` is the canonical path
    of the draft GGUF for draft-* types (already checked to lie in an allowed folder).
    """

    type: SpecType
    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0
    draft_path: str = ""


class Constraint(msgspec.Struct, array_like=True, frozen=True):
    """A grammar the output must follow: `gbnf` text, or a `json_schema` (JSON text) the
    worker converts to GBNF with llama.cpp's own converter. `field` is the request field that
    asked for it, so that a refusal names it (`grammar_string`, `response_format`, ...)."""

    kind: Literal["gbnf", "json_schema"]
    text: str
    field: str = ""


class ImageInput(msgspec.Struct, array_like=True, frozen=True):
    """An image for a vision model: 8-bit RGB pixels, row by row. The gateway decoded, checked and
    resized it; the i-th image goes where the i-th `{"type": "image"}` content part is."""

    width: int
    height: int
    rgb: bytes


class Generate(msgspec.Struct, tag="generate", array_like=True, omit_defaults=True):
    """One generation request. Exactly one of `messages` (chat) or `prompt` (raw text) is set."""

    req_id: int
    log_id: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    template_vars: dict[str, Any] = {}
    max_tokens: int | None = None
    stop: list[str] = []
    sampling: Sampling = Sampling()
    keep_cache: bool = False  # GenieX-KeepCache: the conversation's cached state is kept, not evicted
    speculation: Speculation | None = None
    # Output constraints and extras (issue 4); appended, since array_like is positional.
    constraint: Constraint | None = None
    logit_bias: list[tuple[int, float]] = []  # (token id, bias) added to the logits before sampling
    logprobs: int = -1  # -1: none; else report each token's logprob and this many top alternatives
    special: bool = False  # render control tokens (<|channel|>, [TOOL_CALLS]) so the gateway can parse them
    tools: list[dict[str, Any]] | None = None  # OpenAI tool definitions, for the chat template
    suffix: str | None = None  # with `prompt`: fill in the middle, between prompt and suffix
    # Prompt caching: reuse a cached prefix and keep this request's state when it completes
    # (`cache`), only among requests of the same `cache_key` (the tenant, narrowed by cache_salt).
    cache: bool = True
    cache_key: str = ""
    images: list[ImageInput] = []  # for `{"type": "image"}` parts of `messages`, in order
    # `auto`: a conversation longer than the context loses its oldest turns until it fits
    # (protocol/overflow.py); `disabled`: it is refused (context_length_exceeded).
    truncation: Literal["disabled", "auto"] = "disabled"
    # Tokens the thinking section (`<think>`...) may take before the engine closes it and the answer
    # follows: -1 unlimited, 0 none (workers/engines/llama/think_budget.py).
    reasoning_budget: int = -1
    # interactive, normal or background (protocol/priority.py): the order of the engine's queue and steps
    priority: Priority = "normal"


class CountTokens(msgspec.Struct, tag="count_tokens", array_like=True, omit_defaults=True):
    """How many tokens a chat prompt is, rendered by the model's own template and tokenized as a
    Generate of the same messages would be; nothing is decoded. Answered with TokenCount."""

    req_id: int
    log_id: str
    messages: list[dict[str, Any]]
    template_vars: dict[str, Any] = {}
    tools: list[dict[str, Any]] | None = None
    images: list[ImageInput] = []  # as in Generate: each counts as the tokens its embeddings take


class Tokenize(msgspec.Struct, tag="tokenize", array_like=True):
    """Text to the model's token ids (and, with `with_pieces`, each token's bytes); answered with
    TokenList. `parse_special`: special-token text such as `<|im_start|>` becomes its one id."""

    req_id: int
    log_id: str
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class Detokenize(msgspec.Struct, tag="detokenize", array_like=True):
    """Token ids to the model's text (special tokens rendered); answered with Text."""

    req_id: int
    log_id: str
    tokens: list[int]


class Logits(msgspec.Struct, tag="logits", array_like=True):
    """One prefill-only forward pass over `input_ids`; answered with LogitRows."""

    req_id: int
    log_id: str
    input_ids: list[int]
    last_only: bool = False
    top_n: int = 20  # 0: the whole vocabulary per row


class Warmup(msgspec.Struct, tag="warmup", array_like=True):
    """Nothing to generate: answered with Done once the engine is loaded."""

    req_id: int


class Cancel(msgspec.Struct, tag="cancel", array_like=True):
    req_id: int


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    pass


class SetThreads(msgspec.Struct, tag="threads", array_like=True):
    """How many threads to decode with from now on: the gateway shares the cores
    between busy CPU workers, because spinning thread pools that outnumber the
    cores stall each other to a crawl."""

    n: int


class Embed(msgspec.Struct, tag="embed", array_like=True, omit_defaults=True):
    """Embed a batch of inputs, given as exactly one of `texts` or `token_ids` (whole sequences,
    used as given); answered with Embeddings. `dimensions` 0 keeps the model's width; a smaller
    one truncates each vector (re-normalised when `normalize`)."""

    req_id: int
    log_id: str
    texts: list[str] | None = None
    token_ids: list[list[int]] | None = None
    normalize: bool = True
    dimensions: int = 0
    truncate: bool = False  # an input longer than the model reads is cut to fit (Ollama's default), not refused


class Rerank(msgspec.Struct, tag="rerank", array_like=True, omit_defaults=True):
    """Score every document against the query, `batch_size` documents per forward pass;
    answered with Scores. A cross-encoder model scores (query, document) pairs; any other
    embedding model answers the cosine of the two embeddings."""

    req_id: int
    log_id: str
    query: str
    documents: list[str]
    batch_size: int = 4


class Recognize(msgspec.Struct, tag="recognize", array_like=True):
    """Read the text in one image (OCR); answered with TextRegions. `image` is the encoded file as
    the client sent it (PNG, JPEG, ...): the worker decodes it, within its pixel bounds."""

    req_id: int
    log_id: str
    image: bytes


class Transcribe(msgspec.Struct, tag="transcribe", array_like=True, omit_defaults=True):
    """Speech to text; answered with Transcript. `audio` is the uploaded file's bytes as the client
    sent them (any container and codec FFmpeg reads), decoded in the worker. `language` "": the model
    detects it; `temperature` 0: greedy, with Whisper's fallback to higher temperatures for a window
    that decodes badly; `words`: word timestamps too."""

    req_id: int
    log_id: str
    audio: bytes
    language: str = ""
    prompt: str = ""
    temperature: float = 0.0
    words: bool = False
    stream: bool = False  # a TranscriptPart per segment as it is decoded, before the Transcript


# Silero VAD reads windows of 512 samples at 16 kHz: one probability per 32 ms of audio.
VAD_WINDOW_MS = 32


class DetectSpeech(msgspec.Struct, tag="detect_speech", array_like=True):
    """Voice activity in the next stretch of one audio stream (Silero VAD); answered with
    SpeechProbs. `pcm` is mono 16-bit little-endian PCM at `sample_rate` Hz, as the client sent it;
    `state` is the stream's state from the previous answer (b"": a new stream). The worker keeps
    nothing between requests, so any worker serves any stream and a restart loses nothing."""

    req_id: int
    log_id: str
    pcm: bytes
    sample_rate: int
    state: bytes = b""


class Diarize(msgspec.Struct, tag="diarize", array_like=True):
    """Who spoke when in `audio`, an encoded audio file (WAV, FLAC, Ogg, MP3: what libsndfile
    reads); answered with Diarization. The worker bounds its length (limits.MAX_DIARIZE_SECONDS)."""

    req_id: int
    log_id: str
    audio: bytes


class Speak(msgspec.Struct, tag="speak", array_like=True, omit_defaults=True):
    """Text to speech: `text` spoken sentence by sentence, answered with an Audio per sentence (at
    least one, so the gateway always learns the sample rate), then Done (`prompt_tokens`: the
    phoneme ids the model read). `speed` divides the voice's length scale; a negative noise
    setting means the voice's own (0: no noise, the same audio every time); `voice` names a
    speaker of a multi-speaker model ("" its first; any name for a single-speaker one)."""

    req_id: int
    log_id: str
    text: str
    speed: float = 1.0
    noise_scale: float = -1.0
    noise_w: float = -1.0
    voice: str = ""
    sample_rate: int = 0  # resample the voice's audio to this rate (0: the voice's own)


class GenerateImages(msgspec.Struct, tag="generate_images", array_like=True, omit_defaults=True):
    """Make `n` images of `width` x `height` from a prompt with a diffusion pipeline, one after
    another; answered with Images. `seed` None: a random one; else image i uses `seed + i`. The
    gateway has bounded the work (protocol/images.py)."""

    req_id: int
    log_id: str
    prompt: str
    n: int
    width: int
    height: int
    steps: int
    guidance: float
    negative_prompt: str = ""
    seed: int | None = None


ToWorker = (
    Generate
    | CountTokens
    | Tokenize
    | Detokenize
    | Logits
    | Embed
    | Rerank
    | Recognize
    | Transcribe
    | Diarize
    | GenerateImages
    | Warmup
    | Cancel
    | Shutdown
    | SetThreads
    | Speak
    | DetectSpeech
)


class Device(msgspec.Struct, frozen=True, omit_defaults=True):
    """A compute device an engine's build sees (llama.cpp: a ggml backend device)."""

    name: str  # the backend's name for it: "CPU", "Vulkan0", "CUDA0", "HTP0"
    kind: str  # "cpu", "gpu", "igpu" (a GPU sharing the host's memory), "accel" (an NPU such as HTP)
    description: str = ""  # e.g. "llvmpipe (LLVM 15.0.6, 256 bits)", "NVIDIA H200"
    memory_total: int = 0  # bytes; 0 when the backend does not say
    memory_free: int = 0


class Ready(msgspec.Struct, tag="ready", array_like=True, omit_defaults=True):
    """The worker's first message: it has loaded its engine and can serve."""

    protocol_version: int
    pid: int
    engine: str
    compute: str
    n_ctx: int
    n_ctx_train: int = 0
    n_vocab: int = 0
    parallel: int = 1
    model_bytes: int = 0
    load_seconds: float = 0.0
    chat_template: bool = False
    description: str = ""
    # Appended (array_like is positional). `provider`: what actually ran the model, e.g.
    # "QNNExecutionProvider" or "CPUExecutionProvider" for ONNX ("" when the engine does not
    # say); `n_embd`: the width of its embeddings (0: not an embedding model).
    provider: str = ""
    n_embd: int = 0
    # The tool-call syntax the model's chat template teaches ("hermes", "llama3", "mistral"; ""
    # when it names none): the gateway's parser looks for that syntax, plus plain JSON.
    tool_format: str = ""
    # The CPU features the engine's build uses, e.g. "AVX2 AVX512 AVX512_VNNI" ("" when it does not say).
    cpu_features: str = ""
    # Why the worker runs on the CPU although another unit was asked for (e.g. an NPU chat model
    # whose architecture has no NPU graph); "" when it runs where it was asked to.
    fallback: str = ""
    # Whether the engine's build can offload to a GPU (llama.cpp: llama_supports_gpu_offload), so
    # the gateway learns it from its workers and imports no engine itself; false when it does not say.
    gpu_offload: bool = False
    # The backend devices the engine's build sees ([]: it does not say), the CPU's included.
    devices: list[Device] = []
    # Layers on a GPU or NPU device out of the model's (llama.cpp counts the output layer as one):
    # `ngl` as the worker applied it, 0 when everything runs on the CPU.
    offloaded_layers: int = 0
    n_layers: int = 0
    # The types its KV cache is stored in (protocol/kv_cache.py; "" when it keeps none llama.cpp's way),
    # and one token's K and V in every layer, in bytes, as the loaded model's shape and those types make it.
    kv_bytes_per_token: int = 0
    cache_type_k: str = ""
    cache_type_v: str = ""


class Started(msgspec.Struct, tag="started", array_like=True, omit_defaults=True):
    """A Generate was given a slot: its prompt length, the part reused from cache, and whether
    the prompt itself opened a reasoning block (a template that forces thinking on), so the
    gateway reads the output as reasoning from its first token."""

    req_id: int
    prompt_tokens: int
    cached_tokens: int = 0
    reasoning_open: bool = False
    # The worker's prompt cache after this admission: bytes held in RAM, entries evicted so far.
    cache_bytes: int = 0
    cache_evictions: int = 0
    # Its disk tier (workers/engines/llama/disk_cache.py): bytes of states on disk, states restored
    # from it, evicted from it, and writes that failed (a full disk), so far.
    disk_bytes: int = 0
    disk_hits: int = 0
    disk_evictions: int = 0
    disk_write_errors: int = 0
    # `truncation: auto` dropped this many messages, and the prompt this many tokens, to fit.
    dropped_messages: int = 0
    dropped_tokens: int = 0


class TokenLogprob(msgspec.Struct, array_like=True, gc=False):
    """One generated token: its bytes, its log-probability, and the most likely alternatives."""

    token: bytes
    logprob: float
    top: list[tuple[bytes, float]] = []


class Delta(msgspec.Struct, tag="delta", array_like=True, gc=False):
    """Text produced since the last Delta of this request, and how many tokens it took."""

    req_id: int
    text: str
    n_tokens: int

    logprobs = None  # a plain Delta carries none; see LogprobDelta


class LogprobDelta(Delta, tag="delta_lp", array_like=True, gc=False):
    """A Delta with its tokens' logprobs, for requests that ask (plain Deltas stay 15 bytes)."""

    logprobs: list[TokenLogprob]  # type: ignore[assignment]


class Done(msgspec.Struct, tag="done", array_like=True, gc=False, omit_defaults=True):
    req_id: int
    finish_reason: str  # "stop" | "length" | "cancelled"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # Draft tokens the target model confirmed / refused (speculative requests only).
    accepted_tokens: int = 0
    rejected_tokens: int = 0
    # The stop string that ended the generation ("" for any other end), for clients that report it
    # (Anthropic's `stop_sequence`).
    stop_sequence: str = ""
    # Tokens generated inside a thinking section (0: none, or an engine that does not count them).
    reasoning_tokens: int = 0


class Failed(msgspec.Struct, tag="failed", array_like=True, omit_defaults=True):
    """A request the worker could not serve, and why; `code` is a machine-readable detail
    (e.g. "context_length_exceeded") passed on to the client."""

    req_id: int
    kind: ErrorKind
    message: str
    code: str | None = None


class TokenCount(msgspec.Struct, tag="token_count", array_like=True):
    """The answer to CountTokens."""

    req_id: int
    n_tokens: int


class TokenList(msgspec.Struct, tag="token_list", array_like=True):
    """The answer to Tokenize; `pieces` (one per token, raw bytes: a piece may be part of a UTF-8
    character) only when asked for."""

    req_id: int
    tokens: list[int]
    pieces: list[bytes] = []


class Text(msgspec.Struct, tag="text", array_like=True):
    """The answer to Detokenize, as bytes: ids may end inside a UTF-8 character."""

    req_id: int
    content: bytes


class LogitRows(msgspec.Struct, tag="logit_rows", array_like=True):
    """The answer to Logits, as raw little-endian arrays (a full-vocabulary row is 49k floats;
    msgpack would spend a byte of tag on each): `logits` float32 [n_rows x (top_n or vocab)],
    `token_ids` int32 [n_rows x top_n] (empty when top_n is 0)."""

    req_id: int
    n_rows: int
    vocab_size: int
    top_n: int
    logits: bytes
    token_ids: bytes = b""


class Dying(msgspec.Struct, tag="dying", array_like=True):
    """Sent from the worker's top-level handler so the gateway can name the root cause."""

    message: str


class Embeddings(msgspec.Struct, tag="embeddings", array_like=True):
    """The answer to Embed: `n` rows of `dim` little-endian float32s, in input order."""

    req_id: int
    n: int
    dim: int
    data: bytes
    prompt_tokens: int


class Scores(msgspec.Struct, tag="scores", array_like=True):
    """The answer to Rerank: one score per document, in input order; `mode` is
    "cross-encoder" or "bi-encoder"."""

    req_id: int
    scores: list[float]
    prompt_tokens: int
    mode: str


class TextRegion(msgspec.Struct, array_like=True):
    """One line of text found in an image: what it reads, the recogniser's confidence (0..1), and
    the axis-aligned box around its detected outline, in the image's pixels (origin top left)."""

    text: str
    confidence: float
    x: float
    y: float
    width: float
    height: float


class TextRegions(msgspec.Struct, tag="text_regions", array_like=True):
    """The answer to Recognize: the image's size and its lines of text, in reading order."""

    req_id: int
    width: int
    height: int
    regions: list[TextRegion]


class TranscriptSegment(msgspec.Struct, array_like=True, gc=False):
    """One decoded segment, with the fields OpenAI's verbose_json gives it (times in seconds)."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float


class TranscriptWord(msgspec.Struct, array_like=True, gc=False):
    word: str
    start: float
    end: float
    probability: float


class Transcript(msgspec.Struct, tag="transcript", array_like=True):
    """The answer to Transcribe: the audio's `duration` in seconds, the `language` code spoken (given
    or detected) and the segments in order; `words` only when asked for."""

    req_id: int
    language: str
    duration: float
    segments: list[TranscriptSegment]
    words: list[TranscriptWord] = []


class TranscriptPart(msgspec.Struct, tag="transcript_part", array_like=True, gc=False):
    """One segment of a streamed Transcribe, sent as soon as it is decoded; the Transcript follows."""

    req_id: int
    segment: TranscriptSegment


class SpeechProbs(msgspec.Struct, tag="speech_probs", array_like=True, gc=False):
    """The answer to DetectSpeech: the probability of speech in each whole window (VAD_WINDOW_MS of
    audio) that the stream completed, and the stream's state for its next request."""

    req_id: int
    probs: list[float]
    state: bytes


class SpeakerTurn(msgspec.Struct, array_like=True, frozen=True):
    """One stretch of speech by one speaker, in seconds from the start of the audio."""

    start: float
    end: float
    speaker: str


class Diarization(msgspec.Struct, tag="diarization", array_like=True):
    """The answer to Diarize: the speaker turns in time order, and the seconds of audio read."""

    req_id: int
    turns: list[SpeakerTurn]
    duration: float


class Audio(msgspec.Struct, tag="audio", array_like=True, gc=False):
    """One sentence of a Speak's audio: mono 16-bit little-endian PCM at `sample_rate` Hz."""

    req_id: int
    pcm: bytes
    sample_rate: int


class Images(msgspec.Struct, tag="images", array_like=True):
    """The answer to GenerateImages: one PNG file per image, in order. `revised_prompt` is the
    prompt as the text encoder read it (the request's own, or what was kept of a prompt longer
    than its context), `prompt_tokens` its length in tokens."""

    req_id: int
    png: list[bytes]
    prompt_tokens: int
    revised_prompt: str
    seconds: float


class UpstreamHealth(msgspec.Struct, tag="upstream_health", array_like=True):
    """What the `upstream` engine's last probe of its remote server found (sent after each probe):
    `checked` is the probe's Unix time, `detail` why it is unhealthy ("" when healthy)."""

    url: str
    healthy: bool
    detail: str
    latency_ms: float
    checked: float


class Beat(msgspec.Struct, tag="beat", array_like=True, gc=False):
    """The worker's heartbeat, once a second from a thread of its own (workers/heartbeat.py): the
    engine steps its loop has finished, and how long the step it is in has run (0: between steps).
    Beats stop when the process stops (SIGSTOP, a deadlock holding the GIL); `step_s` grows when
    one engine call never returns (a stuck driver). The gateway reads both (gateway/supervisor/liveness.py)."""

    steps: int
    step_s: float


FromWorker = (
    Ready
    | Beat
    | Started
    | Delta
    | LogprobDelta
    | Done
    | Failed
    | TokenCount
    | TokenList
    | Text
    | LogitRows
    | Embeddings
    | Scores
    | Transcript
    | TranscriptPart
    | SpeechProbs
    | Images
    | Dying
    | TextRegions
    | Diarization
    | Audio
    | UpstreamHealth
)


class Codec:
    """One encoder and one typed decoder for one direction."""

    def __init__(self, decode_type: Any) -> None:
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder(decode_type)
        self.encode = self._enc.encode
        self.decode = self._dec.decode


def gateway_codec() -> Codec:
    """Encodes ToWorker (any struct), decodes FromWorker."""
    return Codec(FromWorker)


def worker_codec() -> Codec:
    """Encodes FromWorker, decodes ToWorker."""
    return Codec(ToWorker)
