"""What a web page or a careless client can send: refused with the right status, never a 500 that
quotes the server, and never a worker that dies for it."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import MODEL
from tests.server_proc import ServerProcess

HI = [{"role": "user", "content": "hi"}]


def post(server: ServerProcess, body: dict, **kw: object) -> httpx.Response:  # type: ignore[type-arg]
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60, **kw)  # type: ignore[arg-type]


def test_a_text_plain_post_is_refused_without_reaching_a_model(server: ServerProcess) -> None:
    """A page can send text/plain cross-origin without a CORS preflight; JSON it cannot."""
    body = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}]}' % MODEL.encode()
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        r = httpx.post(
            f"{server.base_url}/v1/chat/completions", content=body, headers={"content-type": ctype}, timeout=30
        )
        assert r.status_code == 415 and r.json()["error"] == "`Content-Type` must be application/json", ctype
    ok = httpx.post(f"{server.base_url}/v1/chat/completions", content=body.replace(b"}]}", b'}], "max_tokens": 1}'),
                    headers={"content-type": "application/json; charset=utf-8"}, timeout=60)  # fmt: skip
    assert ok.status_code == 200


def _post_routes(server: ServerProcess) -> list[str]:
    spec = httpx.get(f"{server.base_url}/openapi.json", timeout=10).json()
    return [path for path, ops in spec["paths"].items() if "post" in ops]


def _said(r: httpx.Response) -> str:
    error = r.json()["error"]  # Anthropic's routes nest it: {"type": "error", "error": {"message": ...}}
    return error["message"] if isinstance(error, dict) else error


# What a page may send anywhere without a CORS preflight (a browser reads the type's essence).
SAFELISTED = ("text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x")


def test_what_a_page_can_post_anywhere_is_refused_on_every_route(server: ServerProcess) -> None:
    """A page on another site may POST text/plain, a form, or a body with no type at all (fetch()
    of an ArrayBuffer) without the browser asking first; the browser names the page in Origin."""
    routes = _post_routes(server)
    assert {"/v1/chat/completions", "/api/chat", "/v1/messages", "/v1/audio/transcriptions"} <= set(routes)
    body = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}' % MODEL.encode()
    page = {"origin": "https://evil.example"}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        for path in routes:
            for ctype in SAFELISTED:
                form_route = path == "/v1/audio/transcriptions" and ctype.startswith("multipart/")
                for origin in (page, {}):  # refused for its type, whether a page sent it or not
                    if form_route and not origin:
                        continue  # a form from no page: the route's own (this one is broken: a 400)
                    r = http.post(path, content=body, headers={"content-type": ctype, **origin})
                    status, says = (403, "--origins") if form_route else (415, "`Content-Type` must be")
                    assert r.status_code == status and says in _said(r), (path, ctype, origin, r.status_code, r.text)
            r = http.post(path, content=body, headers=page)  # no Content-Type, from a page
            assert r.status_code == 403 and "--origins" in _said(r), (path, r.status_code, r.text)
    assert "Traceback" not in server.log()


def test_a_body_without_a_content_type_is_read_as_json(server: ServerProcess) -> None:
    """LiteLLM's Ollama provider posts JSON with no Content-Type, as Ollama allows; so does the
    server's own page (its Origin) where it may. An empty or broken body is the route's 400."""
    ask = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], ' % MODEL.encode()
    for path, rest in (("/v1/chat/completions", b'"max_tokens": 1}'),
                       ("/api/chat", b'"options": {"num_predict": 1}, "stream": false}')):  # fmt: skip
        ok = httpx.post(f"{server.base_url}{path}", content=ask + rest, timeout=60)
        assert ok.status_code == 200 and "content-type" not in ok.request.headers, ok.text
        own = httpx.post(f"{server.base_url}{path}", content=ask + rest, headers={"origin": server.base_url},
                         timeout=60)  # fmt: skip
        assert own.status_code == 200, own.text
        for broken, says in ((b"", "the body is empty"), (ask, "not JSON")):
            r = httpx.post(f"{server.base_url}{path}", content=broken, timeout=30)
            assert r.status_code == 400 and says in r.json()["error"], (path, r.text)
    r = httpx.post(f"{server.base_url}/v1/audio/transcriptions", content=ask + b"}", timeout=30)
    assert r.status_code == 415 and "multipart/form-data" in r.json()["error"], r.text


def test_a_foreign_host_header_is_refused(server: ServerProcess) -> None:
    """DNS rebinding: a page at evil.example resolved to 127.0.0.1 sends its own host name."""
    r = post(server, {"model": MODEL, "messages": HI, "max_tokens": 1}, headers={"host": "evil.example:8080"})
    assert r.status_code == 403 and "DNS rebinding" in r.json()["error"]
    assert httpx.get(f"{server.base_url}/v1/models", headers={"host": "evil.example"}, timeout=10).status_code == 403
    for host in ("localhost", f"localhost:{server.port}", f"127.0.0.1:{server.port}", "[::1]:1"):
        assert httpx.get(f"{server.base_url}/v1/models", headers={"host": host}, timeout=10).status_code == 200, host


def test_an_operator_may_allow_more_host_names(start) -> None:  # type: ignore[no-untyped-def]
    srv = start("--nctx", "512", "--allowed-host", "geniex.lan")
    assert httpx.get(f"{srv.base_url}/v1/models", headers={"host": "geniex.lan:18181"}, timeout=10).status_code == 200
    assert httpx.get(f"{srv.base_url}/v1/models", headers={"host": "other.lan"}, timeout=10).status_code == 403
    anyone = start("--nctx", "512", "--allowed-host", "*")
    assert httpx.get(f"{anyone.base_url}/v1/models", headers={"host": "other.lan"}, timeout=10).status_code == 200


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"logit_bias": {"99999999999999999999": 1}}, "logit_bias"),
        ({"logit_bias": {"-1": 1}}, "logit_bias"),
    ],
)
def test_out_of_range_integers_are_400s(server: ServerProcess, extra: dict, field: str) -> None:  # type: ignore[type-arg]
    r = post(server, {"model": MODEL, "messages": HI, "max_tokens": 1, **extra})
    assert r.status_code == 400 and f"`{field}" in r.json()["error"], r.text


@pytest.mark.parametrize("seed", [2**64 - 1, 2**64, 2**80, -(2**63) - 1])
def test_any_integer_seed_is_served_with_several_choices(server: ServerProcess, seed: int) -> None:
    """A seed is reduced to 64 bits, and choice i samples with seed + i: nothing overflows."""
    r = post(server, {"model": MODEL, "messages": HI, "max_tokens": 2, "seed": seed, "n": 2, "temperature": 1})
    assert r.status_code == 200 and len(r.json()["choices"]) == 2


def _nested_schema(levels: int) -> dict:  # type: ignore[type-arg]
    s: dict = {"type": "string"}  # type: ignore[type-arg]
    for _ in range(levels):
        s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
    return s


def _schema(schema: dict) -> dict:  # type: ignore[type-arg]
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


# Each of these killed the worker (SIGSEGV) or ran it out of memory before they were bounded.
BOMBS = [
    ({"grammar_string": "root ::= " + "(" * 20000 + '"a"' + ")" * 20000}, "grammar_string", "nests groups"),
    ({"grammar_string": 'root ::= "a"{0,100000000}'}, "grammar_string", "repetition"),
    (_schema({"type": "string", "maxLength": 100000}), "response_format", "maxLength"),
    (_schema({"type": "array", "items": {"type": "integer"}, "maxItems": 10**9}), "response_format", "maxItems"),
    (_schema({"type": "string", "pattern": "^a{0,100000}$"}), "response_format", "pattern"),
    (_schema(_nested_schema(200)), "response_format", "nests"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": _nested_schema(200)}}]},
        "tools[0]",
        "nests",
    ),
]


def test_grammar_and_schema_bombs_are_400s_and_the_worker_and_its_streams_live_on(server: ServerProcess) -> None:
    post(server, {"model": MODEL, "messages": HI, "max_tokens": 1})
    pids = server.worker_pids()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 48,
            "stream": True, "temperature": 0}  # fmt: skip
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=120) as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith("data:")
        for extra, field, says in BOMBS:
            r = post(server, {"model": MODEL, "messages": HI, "max_tokens": 4, **extra})
            assert r.status_code == 400 and f"`{field}" in r.json()["error"] and says in r.json()["error"], r.text
        rest = [line for line in lines if line.startswith("data:")]
    assert rest[-1] == "data: [DONE]" and '"finish_reason":null' not in rest[-2].replace(" ", ""), rest[-2]
    assert server.worker_pids() == pids


def test_json_nested_past_the_decoders_limit_is_a_400(server: ServerProcess) -> None:
    deep = "[" * 5000 + "]" * 5000
    body = (
        f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "hi"}}], "response_format": {{"x": {deep}}}}}'
    )
    r = httpx.post(f"{server.base_url}/v1/chat/completions", content=body,
                   headers={"content-type": "application/json"}, timeout=30)  # fmt: skip
    assert r.status_code == 400 and "nests too deeply" in r.json()["error"]


BIG = 2**70  # beyond msgpack's 64 bits: once a 500 on the way to the worker


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/chat/completions", {"messages": HI, "max_tokens": BIG}, "max_tokens"),
        ("/v1/chat/completions", {"messages": HI, "max_completion_tokens": 2**31}, "max_completion_tokens"),
        ("/v1/chat/completions", {"messages": HI, "top_k": BIG}, "top_k"),
        ("/v1/chat/completions", {"messages": HI, "nctx": BIG}, "nctx"),
        ("/v1/chat/completions", {"messages": HI, "ngl": -BIG}, "ngl"),
        ("/v1/chat/completions", {"messages": HI, "ngl": -2}, "ngl"),  # -1 is "all"; below it means nothing
        ("/v1/chat/completions", {"messages": HI, "ngl": 2**40}, "ngl"),
        ("/v1/chat/completions", {"messages": HI, "ngl": "all"}, "ngl"),
        ("/v1/chat/completions", {"messages": HI, "spec_type": "ngram-simple", "spec_n_max": BIG}, "spec_n_max"),
        ("/v1/completions", {"prompt": "x", "max_tokens": BIG}, "max_tokens"),
        ("/v1/logits", {"input_ids": [1, BIG]}, "input_ids[1]"),
        ("/v1/logits", {"input_ids": [1], "top_n": BIG}, "top_n"),
        ("/v1/embeddings", {"input": [[1, BIG]]}, "input[0][1]"),
        ("/v1/embeddings", {"input": "x", "dimensions": BIG}, "dimensions"),
        ("/v1/reranking", {"query": "q", "documents": ["d"], "batch_size": BIG}, "batch_size"),
    ],
)
def test_integers_beyond_32_bits_are_400s(server: ServerProcess, path: str, body: dict, field: str) -> None:  # type: ignore[type-arg]
    """Found by fuzzing (tests/fuzz): each of these was a 500 (msgpack overflow) or, for nctx, a
    worker key that could not be named; llama.cpp takes all of them as 32-bit integers."""
    r = httpx.post(f"{server.base_url}{path}", json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == 400 and f"`{field}`" in r.json()["error"], r.text


def tool_call(arguments: str) -> dict:  # type: ignore[type-arg]
    return {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                 "function": {"name": "f", "arguments": arguments}}]}  # fmt: skip


@pytest.mark.parametrize("arguments", [f'{{"n": {BIG}}}', "[" * 1100 + "]" * 1100])
def test_tool_call_arguments_a_worker_cannot_receive_are_rendered_as_text(
    server: ServerProcess, arguments: str
) -> None:
    """Found by fuzzing: arguments are parsed to render them with the template's `tojson`; JSON
    with an integer beyond 64 bits, or nested past Python's recursion limit (1000), was a 500."""
    r = post(server, {"model": MODEL, "messages": [tool_call(arguments), *HI], "max_tokens": 1})
    assert r.status_code == 200, r.text


def test_a_tool_schema_with_an_integer_beyond_64_bits_is_a_400(server: ServerProcess) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "maxProperties": BIG}}}]
    r = post(server, {"model": MODEL, "messages": HI, "tools": tools, "max_tokens": 1})
    assert r.status_code == 400 and "`tools[0].function.parameters`" in r.json()["error"], r.text


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/chat/completions", {"messages": HI, "max_tokens": "3"}, "max_tokens"),
        ("/v1/chat/completions", {"messages": HI, "max_tokens": 1, "stream": "false"}, "stream"),
        ("/v1/chat/completions", {"messages": HI, "max_tokens": 1, "top_k": 1.0}, "top_k"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 1, "echo": 1}, "echo"),
        ("/v1/logits", {"input_ids": [1], "last_only": 0}, "last_only"),
        ("/v1/logits", {"input_ids": ["1"]}, "input_ids[0]"),
        ("/v1/embeddings", {"input": "x", "dimensions": "8"}, "dimensions"),
        ("/v1/reranking", {"query": "q", "documents": ["d"], "normalize": "true"}, "normalize"),
    ],
)
def test_values_of_the_wrong_type_are_400s_not_coerced(
    server: ServerProcess, path: str, body: dict, field: str
) -> None:  # type: ignore[type-arg]
    """Found by fuzzing: Litestar converts a `data` body leniently, so each of these was served as
    if its value had the declared type; bodies are now decoded strictly (gateway/http/body.py)."""
    r = httpx.post(f"{server.base_url}{path}", json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == 400 and f"`{field}`: Expected" in r.json()["error"], r.text


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "the body is empty"),
        (b"{", "not JSON"),
        (b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nests too deeply"),
    ],
)
def test_a_body_that_is_not_a_request_is_a_400(server: ServerProcess, content: bytes, words: str) -> None:
    """Nesting past the recursion limit was a 500 (RecursionError in the JSON decoder)."""
    r = httpx.post(f"{server.base_url}/v1/chat/completions", content=content,
                   headers={"content-type": "application/json"}, timeout=30)  # fmt: skip
    assert r.status_code == 400 and words in r.json()["error"], r.text
