"""Chat completions through the real server, the real worker and real SmolLM2, with the real SDK."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import MODEL
from tests.server_proc import ServerProcess

HAIKU = [{"role": "user", "content": "Write a short poem about the sea."}]


def chat(client: openai.OpenAI, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", HAIKU)
    return client.chat.completions.create(**kw)


# ---- models -----------------------------------------------------------------


def test_models_list_and_get(client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list().data]
    assert MODEL in ids
    m = client.models.retrieve(MODEL)
    assert m.id == MODEL and m.owned_by == "HuggingFaceTB"


def test_unknown_model_is_404_with_error_body(server: ServerProcess) -> None:
    r = httpx.get(f"{server.base_url}/v1/models/nobody/nothing:Q4_0")
    assert r.status_code == 404
    assert "nobody/nothing" in r.json()["error"]
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json={"model": "nobody/nothing", "messages": HAIKU})
    assert r.status_code == 404 and isinstance(r.json()["error"], str)


def test_listed_ids_round_trip_and_bare_repo_resolves(client: openai.OpenAI) -> None:
    for m in client.models.list().data:
        if m.id == MODEL:
            assert chat(client, model=m.id, max_tokens=2).model == MODEL
    bare = MODEL.split(":")[0]
    assert chat(client, model=bare, max_tokens=2).model == MODEL


# ---- non-streaming ----------------------------------------------------------


def test_non_streaming_shape_and_usage(client: openai.OpenAI) -> None:
    r = chat(client, max_tokens=5, temperature=0)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.created > 0 and r.model == MODEL
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant" and c.message.content
    assert c.finish_reason == "length"
    assert r.usage is not None
    assert r.usage.completion_tokens == 5
    assert r.usage.prompt_tokens > 10  # the template adds a system prompt and role markers
    assert r.usage.total_tokens == r.usage.prompt_tokens + 5


def test_finish_reason_stop_when_model_ends(client: openai.OpenAI) -> None:
    r = chat(
        client,
        messages=[{"role": "user", "content": "What is 2+2? Answer with only the number."}],
        temperature=0,
        max_tokens=50,
    )
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 50


def test_greedy_is_deterministic(client: openai.OpenAI) -> None:
    a = chat(client, temperature=0, max_tokens=40).choices[0].message.content
    b = chat(client, temperature=0, max_tokens=40).choices[0].message.content
    assert a == b and a


def test_seed_makes_sampling_repeatable(client: openai.OpenAI) -> None:
    outs = {chat(client, temperature=1.0, seed=1234, max_tokens=30).choices[0].message.content for _ in range(2)}
    assert len(outs) == 1
    other = {chat(client, temperature=1.5, top_p=1.0, seed=s, max_tokens=30, extra_body={"top_k": 0, "min_p": 0.0}).choices[0].message.content
             for s in (1, 2, 3)}  # fmt: skip
    assert len(other) > 1, "different seeds at high temperature should not all agree"


def test_truncation_samplers_are_honoured(client: openai.OpenAI) -> None:
    greedy = chat(client, temperature=0, max_tokens=30).choices[0].message.content
    # Each of these leaves only the most likely token, so hot sampling must equal greedy.
    for kw in ({"top_k": 1}, {"min_p": 1.0}, {"top_p": 0.0}):  # top_p rides in extra_body too, for symmetry
        got = chat(client, temperature=1.5, seed=7, max_tokens=30, extra_body=kw).choices[0].message.content
        assert got == greedy, kw


def test_penalties_are_honoured(client: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "Repeat the word 'cat' twenty times."}]
    plain = chat(client, messages=msgs, temperature=0, max_tokens=30).choices[0].message.content
    for kw in ({"repetition_penalty": 1.8}, {"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        got = chat(client, messages=msgs, temperature=0, max_tokens=30, extra_body=kw).choices[0].message.content
        assert got != plain, kw


def test_stop_sequences_are_cut_and_not_returned(client: openai.OpenAI) -> None:
    full = chat(client, temperature=0, max_tokens=40).choices[0].message.content
    words = full.split()
    assert len(words) > 4
    stop = words[3]
    cut = full[: full.index(stop)]
    for stop_arg in (stop, [stop, "zzzz-never"]):
        r = chat(client, temperature=0, max_tokens=40, stop=stop_arg)
        assert r.choices[0].message.content == cut
        assert r.choices[0].finish_reason == "stop"


def test_max_tokens_alias(client: openai.OpenAI) -> None:
    assert chat(client, max_tokens=3).usage.completion_tokens == 3
    assert chat(client, max_completion_tokens=4).usage.completion_tokens == 4
    # both present: max_tokens is ignored
    r = chat(client, max_completion_tokens=2, extra_body={"max_tokens": 7})
    assert r.usage.completion_tokens == 2


# ---- streaming --------------------------------------------------------------


def test_streaming_chunks_carry_identity_and_end_properly(client: openai.OpenAI) -> None:
    chunks = list(chat(client, stream=True, temperature=0, max_tokens=12, stream_options={"include_usage": True}))
    assert len(chunks) >= 4
    first = chunks[0]
    for ch in chunks:
        assert ch.id == first.id and ch.object == "chat.completion.chunk" and ch.model == MODEL and ch.created > 0
    *content, final, usage = chunks
    assert final.choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in content)
    assert usage.choices == [] and usage.usage is not None
    assert usage.usage.completion_tokens == 12
    text = "".join(c.choices[0].delta.content or "" for c in content)
    assert text == chat(client, temperature=0, max_tokens=12).choices[0].message.content


def test_stream_wire_framing(server: ServerProcess) -> None:
    body = {"model": MODEL, "messages": HAIKU, "stream": True, "max_tokens": 5, "temperature": 0,
            "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e[6:]) for e in events[:-1]]
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"]["completion_tokens"] == 5
    assert payloads[-2]["choices"][0]["finish_reason"] == "length"


def test_stream_without_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(chat(client, stream=True, max_tokens=4))
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)


# ---- warm-up and errors -----------------------------------------------------


def test_warmup_with_empty_messages_returns_null(server: ServerProcess) -> None:
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json={"model": MODEL, "messages": []}, timeout=60)
    assert r.status_code == 200 and r.content == b"null"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": HAIKU}, "model"),
        ({"model": MODEL}, "messages"),
        ({"model": MODEL, "messages": [{"content": "x"}]}, "messages[0].role"),
        ({"model": MODEL, "messages": HAIKU, "temperature": "hot"}, "temperature"),
        ({"model": MODEL, "messages": HAIKU, "temperature": 5}, "temperature"),
        ({"model": MODEL, "messages": HAIKU, "top_p": 1.5}, "top_p"),
        ({"model": MODEL, "messages": HAIKU, "max_tokens": 0}, "max_tokens"),
        ({"model": MODEL, "messages": HAIKU, "presence_penalty": -3}, "presence_penalty"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": MODEL, "messages": HAIKU, "compute": "tpu"}, "compute"),
    ],
)
def test_invalid_input_is_400_naming_the_field(server: ServerProcess, body: dict, field: str) -> None:
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    # The request's own field, never the handler's parameter name (`data`).
    assert isinstance(err, str) and f"`{field}`: " in err and "`data`" not in err, err


def test_malformed_json_is_400(server: ServerProcess) -> None:
    r = httpx.post(f"{server.base_url}/v1/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400 and "error" in r.json()


def test_prompt_longer_than_context_is_400(client: openai.OpenAI, server: ServerProcess) -> None:
    long = "word " * 400
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, messages=[{"role": "user", "content": long}], extra_body={"nctx": 256}, max_tokens=4)
    assert "context is 256" in str(e.value.body)
    r = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": [{"role": "user", "content": long}], "nctx": 256})  # fmt: skip
    assert r.status_code == 400 and r.json()["code"] == "context_length_exceeded"
    # streaming too: refused before the first byte, with the same status
    r = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": [{"role": "user", "content": long}], "nctx": 256, "stream": True})  # fmt: skip
    assert r.status_code == 400 and r.json()["code"] == "context_length_exceeded"


# ---- worker selection -------------------------------------------------------


def test_two_nctx_values_run_in_two_worker_processes(client: openai.OpenAI, server: ServerProcess) -> None:
    chat(client, max_tokens=2, extra_body={"nctx": 512})
    chat(client, max_tokens=2, extra_body={"nctx": 1024})
    rows = httpx.get(f"{server.base_url}/v1/workers").json()["data"]
    by_nctx = {w["nctx"]: w["pid"] for w in rows if w["model"] == MODEL}
    assert 512 in by_nctx and 1024 in by_nctx
    assert by_nctx[512] != by_nctx[1024]
    children = set(server.worker_pids())
    assert {by_nctx[512], by_nctx[1024]} <= children  # real OS processes under the gateway, as `ps` shows


def test_unavailable_compute_falls_back_to_cpu(client: openai.OpenAI, server: ServerProcess) -> None:
    r = chat(client, max_tokens=2, extra_body={"compute": "gpu"})  # this llama.cpp build has no GPU offload
    assert r.choices[0].message.content is not None
    assert "falling back to cpu" in server.log()


def test_a_fallback_names_the_doctors_check_of_its_cause(tmp_path: Path) -> None:
    """The worker's reason points at the doctor's check of its cause, in /v1/workers and in /ready,
    and that check is in `geniex doctor`'s report, failed, for the same reason. A server of its own:
    on the shared one an earlier request may have taught the gateway already that this build has no
    GPU, and a `gpu` request then goes straight to a CPU worker, with nothing to fall back from."""
    srv = ServerProcess(tmp_path / "data", "--nctx", "512")
    try:
        srv.wait_ready()
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
        chat(client, max_tokens=2, extra_body={"compute": "gpu"})  # this llama.cpp build has no GPU offload
        rows = httpx.get(f"{srv.base_url}/v1/workers").json()["data"]
        row = next(w for w in rows if w["model"] == MODEL and w["compute"] == "gpu")
        assert (row["runs_on"], row["doctor_check"]) == ("cpu", "gpu.backends"), row
        ready = httpx.get(f"{srv.base_url}/ready").json()
        assert {"model": MODEL, "compute": "gpu", "runs_on": "cpu", "reason": row["fallback"],
                "doctor_check": "gpu.backends"} in ready["fallback"], ready  # fmt: skip
    finally:
        srv.stop()
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "doctor", "--json", "--compute", "gpu"],
                          capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    check = next(c for c in json.loads(done.stdout)["checks"] if c["name"] == row["doctor_check"])
    assert check["status"] == "fail" and "no GPU backend" in check["detail"] and "GPU=vulkan" in check["fix"], check


def test_stream_interval_groups_tokens_without_changing_the_text(tmp_path: Path) -> None:
    """--stream-interval-ms: tokens closer together than it share a chunk; the first goes at once."""
    kw = {"model": MODEL, "messages": [{"role": "user", "content": "Count from one to twenty."}], "max_tokens": 30,
          "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip

    def pieces(c: openai.OpenAI) -> tuple[list[str], int]:
        chunks = list(c.chat.completions.create(**kw))  # type: ignore[call-overload]
        return [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content], chunks[
            -1
        ].usage.completion_tokens

    texts = []
    for interval, expect in (("0", "one per token"), ("60000", "first, then the rest")):
        srv = ServerProcess(tmp_path / f"data{interval}", "--nctx", "2048", "--stream-interval-ms", interval)
        try:
            srv.wait_ready()
            c = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
            got, tokens = pieces(c)
        finally:
            srv.stop()
        # Compared between these two servers, which serve nothing else: on the shared one a request
        # batched beside another may take another greedy path (batched float sums differ).
        texts.append("".join(got))
        if expect == "one per token":
            assert len(got) == tokens  # SmolLM2's pieces here are whole ASCII tokens
        else:
            assert len(got) == 2, got
    assert texts[0] == texts[1]
