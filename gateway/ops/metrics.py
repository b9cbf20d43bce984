"""Prometheus metrics for `GET /metrics`, named the way llama.cpp and vLLM name theirs.

Dashboards built for `llamacpp:*` or `vllm:*` read these as they are; every series carries a
`model` label (a resolved model id, so its cardinality is bounded by the model store, never by
what clients type). Gauges are computed at scrape time from the pool, so nothing on the request
path keeps them up to date. Counters and histograms are written once per request, in
`RequestTimer.finish`; on the relay's per-token path metrics add one integer test.

The pool reports worker starts, crashes and evictions through `Metrics.worker_*`; this module
imports neither the pool nor its handles, so the pool is seen only through small Protocols.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

OUTCOMES = ("ok", "error", "cancelled")

# A local server answers in milliseconds to minutes: a cold start puts model loading into TTFT,
# and a long answer on a laptop CPU can run for minutes.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0)


class ReadyLike(Protocol):
    parallel: int


class WorkerLike(Protocol):
    """What the scrape reads from a `WorkerHandle`."""

    @property
    def key(self) -> Any: ...  # WorkerKey: `.model`, `.slug`
    @property
    def ready_info(self) -> ReadyLike | None: ...

    @property
    def inflight(self) -> int: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def status(self) -> str: ...
    @property
    def cache_bytes(self) -> int: ...
    @property
    def cache_evictions(self) -> int: ...
    def rss(self) -> int | None: ...


class LimiterLike(Protocol):
    def snapshot(self) -> Mapping[str, tuple[int, int, int, Mapping[str, int]]]: ...


class LedgerLike(Protocol):
    write_failures: int

    @property
    def pending(self) -> int: ...


class PoolLike(Protocol):
    @property
    def workers(self) -> Mapping[Any, WorkerLike]: ...


class _ModelSeries:
    """The labelled children of one model, looked up once: `.labels()` costs a lock and a dict."""

    __slots__ = ("cache_hits", "cached", "e2e", "generated", "outcome", "prompt", "tpot", "ttft")

    def __init__(self, m: Metrics, model: str) -> None:
        self.prompt = (m.prompt_tokens.labels(model), m.vllm_prompt_tokens.labels(model))
        self.generated = (m.tokens_predicted.labels(model), m.vllm_generation_tokens.labels(model))
        self.ttft = m.ttft.labels(model)
        self.tpot = m.tpot.labels(model)
        self.e2e = m.e2e.labels(model)
        self.outcome = {o: m.requests.labels(model, o) for o in OUTCOMES}
        self.cache_hits = m.cache_hits.labels(model)
        self.cached = m.cache_reused_tokens.labels(model)
        # Zero-valued series from the first request on, so `rate()` and alerts see a model's
        # lifecycle counters before the first crash rather than a missing series.
        for c in (m.worker_starts, m.worker_crashes, m.worker_hangs, m.worker_evictions, m.worker_unloads):
            c.labels(model)


class Metrics:
    """One registry (not prometheus-client's global one) and every series the gateway exports."""

    def __init__(self, *, process: bool = True) -> None:
        r = self.registry = CollectorRegistry()
        self.prompt_tokens = Counter("llamacpp:prompt_tokens", "Prompt tokens processed.", ["model"], registry=r)
        self.tokens_predicted = Counter("llamacpp:tokens_predicted", "Tokens generated.", ["model"], registry=r)
        self.vllm_prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed.", ["model"], registry=r)
        self.vllm_generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", ["model"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Request arrival to first generated text (includes queueing and a cold model load).",
                              ["model"], buckets=TTFT_BUCKETS, registry=r)  # fmt: skip
        self.tpot = Histogram("vllm:time_per_output_token_seconds",
                              "Mean time per output token after the first, one observation per request "
                              "(what vLLM v1 calls request_time_per_output_token_seconds).",
                              ["model"], buckets=TPOT_BUCKETS, registry=r)  # fmt: skip
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Request arrival to last token, successful requests.",
                             ["model"], buckets=E2E_BUCKETS, registry=r)  # fmt: skip
        self.requests = Counter("geniex:requests", "Chat requests by outcome (ok, error, cancelled).",
                                ["model", "outcome"], registry=r)  # fmt: skip
        self.worker_starts = Counter("geniex:worker_starts", "Worker processes started.", ["model"], registry=r)
        self.worker_crashes = Counter(
            "geniex:worker_crashes", "Worker processes that died unasked.", ["model"], registry=r
        )
        self.worker_hangs = Counter("geniex:worker_hangs", "Workers killed for making no progress (hung); each is a "
                                    "crash too.", ["model"], registry=r)  # fmt: skip
        self.worker_evictions = Counter("geniex:worker_evictions", "Workers stopped to free memory or slots.",
                                        ["model"], registry=r)  # fmt: skip
        self.worker_unloads = Counter("geniex:worker_unloads", "Workers stopped by POST /v1/models/unload.",
                                      ["model"], registry=r)  # fmt: skip
        self.cache_hits = Counter("geniex:prompt_cache_hits", "Requests that reused a cached prompt prefix.",
                                  ["model"], registry=r)  # fmt: skip
        self.cache_reused_tokens = Counter("geniex:prompt_cache_reused_tokens",
                                           "Prompt tokens whose KV came from the prompt cache, not a prefill.",
                                           ["model"], registry=r)  # fmt: skip
        self.mcp_calls = Counter("geniex:mcp_calls", "MCP tool calls run for responses, by server and outcome (ok, "
                                 "tool_error, timeout, too_large, crashed, unavailable, protocol_error, bad_arguments).",
                                 ["server", "outcome"], registry=r)  # fmt: skip
        self.mcp_call_seconds = Histogram("geniex:mcp_call_seconds", "Time of an MCP tool call, its wait for a slot "
                                          "included.", ["server"], registry=r)  # fmt: skip
        self.energy = Counter("geniex:energy_joules", "The machine's energy shared among the answers made while "
                              "it was drawn (gateway/ops/energy.py), where the OS reports it.", ["model", "compute"],
                              registry=r)  # fmt: skip
        self.mcp_served = Counter("geniex:mcp_server_calls", "Tool calls answered at /mcp (GenieX as an MCP server), "
                                  "by tool and outcome (ok, error, refused).", ["tool", "outcome"], registry=r)  # fmt: skip
        self.realtime_sessions = Gauge("geniex:realtime_sessions", "/v1/realtime sessions open.", registry=r)
        self.realtime_ended = Counter("geniex:realtime_sessions_ended", "/v1/realtime sessions ended, by why "
                                      "(closed by the client, idle, expired, refused over the per-key bound).",
                                      ["reason"], registry=r)  # fmt: skip
        self.realtime_first_audio = Histogram(
            "geniex:realtime_first_audio_seconds", "From the end of the user's speech (server VAD) to the first "
            "audio of the answer sent: transcription, the chat model's first sentence and its speech.",
            buckets=(0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 8, 13, 20), registry=r)  # fmt: skip
        r.register(_PoolCollector(self))
        r.register(_KeyCollector(self))
        r.register(_LedgerCollector(self))
        if process:  # process_resident_memory_bytes and friends, for the gateway itself
            ProcessCollector(registry=r)
        self.pool: PoolLike | None = None
        self.limiter: LimiterLike | None = None
        self.ledger: LedgerLike | None = None
        self._series: dict[str, _ModelSeries] = {}

    def watch(
        self, pool: PoolLike | None, limiter: LimiterLike | None = None, ledger: LedgerLike | None = None
    ) -> None:
        """Scrape-time gauges read this pool, these per-key limits and this usage ledger; the app
        binds them in its lifespan."""
        self.pool = pool
        self.limiter = limiter
        self.ledger = ledger

    def series(self, model: str) -> _ModelSeries:
        s = self._series.get(model)
        if s is None:
            s = self._series[model] = _ModelSeries(self, model)
        return s

    def timer(self, model: str, started: float | None = None) -> RequestTimer:
        return RequestTimer(self.series(model), started)

    def worker_started(self, model: str) -> None:
        self.worker_starts.labels(model).inc()

    def worker_crashed(self, model: str) -> None:
        self.worker_crashes.labels(model).inc()

    def worker_hung(self, model: str) -> None:
        self.worker_hangs.labels(model).inc()

    def worker_evicted(self, model: str) -> None:
        self.worker_evictions.labels(model).inc()

    def worker_unloaded(self, model: str) -> None:
        self.worker_unloads.labels(model).inc()

    def realtime_session(self, opened: bool, reason: str = "") -> None:
        if opened:
            self.realtime_sessions.inc()
            return
        self.realtime_sessions.dec()
        self.realtime_ended.labels(reason).inc()

    def mcp_call(self, server: str, outcome: str, seconds: float) -> None:
        self.mcp_calls.labels(server, outcome).inc()
        self.mcp_call_seconds.labels(server).observe(seconds)

    def answered_with(self, model: str, compute: str, joules: float) -> None:
        """One answer's energy, counted under its model and the unit its worker ran on."""
        self.energy.labels(model, compute or "unknown").inc(joules)

    def mcp_server_call(self, tool: str, outcome: str) -> None:
        self.mcp_served.labels(tool, outcome).inc()


class RequestTimer:
    """Times one request. `first_token()` once, `finish()` once.

    Inter-token latency is aggregated at `finish` as (last - first) / (tokens - 1) and observed
    once per request, not per Delta: per-Delta observation would put a clock read plus a
    histogram lock and bucket search (~1 µs) on the relay's per-token path. The price is that
    a stall inside one request (say, while another request's prompt is prefilled) raises that
    request's mean instead of showing as its own tail sample. The relay already counts tokens
    for `usage`, so it hands the final count to `finish` and calls nothing per token.
    """

    __slots__ = ("_done", "_s", "first", "started")

    def __init__(self, series: _ModelSeries, started: float | None = None) -> None:
        self._s = series
        self.started = time.perf_counter() if started is None else started
        self.first = 0.0
        self._done = False

    def first_token(self) -> None:
        if not self.first:
            self.first = time.perf_counter()

    def finish(self, prompt_tokens: int, generated: int, outcome: str, cached: int = 0) -> None:
        """Record the request once; later calls are ignored (a relay may reach two exits)."""
        if self._done:
            return
        self._done = True
        now = time.perf_counter()
        s = self._s
        if prompt_tokens > 0:
            for c in s.prompt:
                c.inc(prompt_tokens)
        if cached > 0:
            s.cache_hits.inc()
            s.cached.inc(cached)
        if generated > 0:
            for c in s.generated:
                c.inc(generated)
            if not self.first:  # the answer came whole in its final message
                self.first = now
        s.outcome.get(outcome, s.outcome["error"]).inc()
        if self.first:
            s.ttft.observe(self.first - self.started)
            if generated > 1:
                s.tpot.observe((now - self.first) / (generated - 1))
        if outcome == "ok":  # a refused or cut-short request's latency would only blur the picture
            s.e2e.observe(now - self.started)


class _ScrapeCollector(Collector):
    """Gauges read from the live objects at scrape time; `_families` names them (and describes
    them to the registry without a scrape)."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    @staticmethod
    def _families() -> list[GaugeMetricFamily | CounterMetricFamily]:
        raise NotImplementedError


def _disk(i: int) -> Callable[[Any], int]:
    """The handle's disk-tier figure `i` (bytes, hits, evictions, write errors); 0 for one without a tier."""
    return lambda h: getattr(h, "disk", (0, 0, 0, 0))[i]


# Each worker's prompt cache, in RAM and in its disk tier, as its last Started said: one series per
# (model, worker), read from the handle.
_CACHE_SERIES: tuple[tuple[type[GaugeMetricFamily] | type[CounterMetricFamily], str, str, Callable[[Any], int]], ...] = (
    (GaugeMetricFamily, "geniex:prompt_cache_bytes", "Host RAM each worker holds in saved prompt states.",
     lambda h: h.cache_bytes),
    (CounterMetricFamily, "geniex:prompt_cache_evictions", "Saved prompt states each worker dropped for room.",
     lambda h: h.cache_evictions),
    (GaugeMetricFamily, "geniex:prompt_cache_disk_bytes",
     "Bytes of saved prompt states on disk, as each worker last saw its folder.", _disk(0)),
    (CounterMetricFamily, "geniex:prompt_cache_disk_hits",
     "Prompt states each worker restored from disk instead of prefilling.", _disk(1)),
    (CounterMetricFamily, "geniex:prompt_cache_disk_evictions", "Prompt states each worker deleted from disk for room.",
     _disk(2)),
    (CounterMetricFamily, "geniex:prompt_cache_disk_write_errors",
     "Prompt states each worker could not write to disk (a full disk, a read-only data dir).", _disk(3)),
)  # fmt: skip


class _PoolCollector(_ScrapeCollector):
    """Scrape-time gauges from the live pool: request slots in use, queue depth, worker memory."""

    def collect(self) -> Iterator[Metric]:
        pool = self._m.pool
        workers = list(pool.workers.values()) if pool is not None else []
        fams = self._families()
        processing, deferred, running, waiting, rss, states, info, upstream_up, *cache = fams
        per_model: dict[str, list[int]] = {}
        per_state: dict[tuple[str, str], int] = {}  # several workers of one model may share a state
        for h in workers:
            model = h.key.model
            parallel = h.ready_info.parallel if h.ready_info is not None else 0
            inflight = h.inflight
            run = min(inflight, parallel)
            acc = per_model.setdefault(model, [0, 0])
            acc[0] += run
            acc[1] += inflight - run
            per_state[(model, h.status)] = per_state.get((model, h.status), 0) + 1
            mem = h.rss()
            if mem is not None:
                rss.add_metric([model, h.key.slug, str(h.pid)], mem)
            for family, (_kind, _name, _help, value_of) in zip(cache, _CACHE_SERIES, strict=True):
                family.add_metric([model, h.key.slug], value_of(h))
            engine = getattr(h, "engine", "")
            info.add_metric([model, h.key.slug, engine], 1)
            probe = getattr(h, "upstream_health", None)
            if probe is not None:
                upstream_up.add_metric([model, h.key.slug, engine], 1 if probe.healthy else 0)
        for model, (run, wait) in per_model.items():
            processing.add_metric([model], run)
            running.add_metric([model], run)
            deferred.add_metric([model], wait)
            waiting.add_metric([model], wait)
        for (model, state), n in per_state.items():
            states.add_metric([model, state], n)
        return iter(fams)

    @staticmethod
    def _families() -> list[GaugeMetricFamily | CounterMetricFamily]:
        return [
            GaugeMetricFamily("llamacpp:requests_processing", "Requests decoding in a slot.", labels=["model"]),
            GaugeMetricFamily("llamacpp:requests_deferred", "Requests admitted, waiting for a slot.", labels=["model"]),
            GaugeMetricFamily("vllm:num_requests_running", "Requests decoding in a slot.", labels=["model"]),
            GaugeMetricFamily("vllm:num_requests_waiting", "Requests admitted, waiting for a slot.", labels=["model"]),
            GaugeMetricFamily(
                "geniex:worker_resident_memory_bytes",
                "Resident memory of each worker process.",
                labels=["model", "worker", "pid"],
            ),
            GaugeMetricFamily("geniex:workers", "Worker processes by state.", labels=["model", "state"]),
            GaugeMetricFamily(
                "geniex:worker_info",
                "1 per live worker, with the engine that serves its model.",
                labels=["model", "worker", "engine"],
            ),
            GaugeMetricFamily(
                "geniex:upstream_up",
                "1 when the server an upstream model lives on answered its last health probe, else 0.",
                labels=["model", "worker", "engine"],
            ),
            *(kind(name, text, labels=["model", "worker"]) for kind, name, text, _ in _CACHE_SERIES),
        ]


class _KeyCollector(_ScrapeCollector):
    """Per API key with limits (labels come from the operator's key file, so they are few): its
    last minute and its refusals."""

    def collect(self) -> Iterator[Metric]:
        fams = self._families()
        requests, tokens, inflight, refused = fams
        limiter = self._m.limiter
        for label, (n, t, live, refusals) in (limiter.snapshot() if limiter is not None else {}).items():
            requests.add_metric([label], n)
            tokens.add_metric([label], t)
            inflight.add_metric([label], live)
            for limit, count in refusals.items():
                refused.add_metric([label, limit], count)
        return iter(fams)

    @staticmethod
    def _families() -> list[GaugeMetricFamily | CounterMetricFamily]:
        return [
            GaugeMetricFamily(
                "geniex:key_requests_last_minute", "Requests per API key in the last minute.", labels=["key"]
            ),
            GaugeMetricFamily(
                "geniex:key_tokens_last_minute", "Tokens per API key in the last minute.", labels=["key"]
            ),
            GaugeMetricFamily("geniex:key_requests_inflight", "Requests in flight per API key.", labels=["key"]),
            CounterMetricFamily(
                "geniex:key_requests_limited",
                "Requests refused by a per-key limit (rpm, tpm, concurrent).",
                labels=["key", "limit"],
            ),
        ]


class _LedgerCollector(_ScrapeCollector):
    """The usage ledger's failed writes (locked, disk full) and the rows waiting for the next one."""

    def collect(self) -> Iterator[Metric]:
        fams = self._families()
        ledger = self._m.ledger
        if ledger is not None:
            fams[0].add_metric([], ledger.write_failures)
            fams[1].add_metric([], ledger.pending)
        return iter(fams)

    @staticmethod
    def _families() -> list[GaugeMetricFamily | CounterMetricFamily]:
        return [
            CounterMetricFamily(
                "geniex:usage_ledger_write_failures",
                "Usage ledger writes that failed (file locked, disk full); their counts wait in memory.",
            ),
            GaugeMetricFamily("geniex:usage_ledger_pending_rows", "Usage ledger rows waiting for a write to succeed."),
        ]
