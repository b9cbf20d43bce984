"""Stored, background and replayed Responses, the input token count and the Conversations API, on
the real server and SmolLM2, through the official `openai` SDK (and httpx where the raw answer
matters): what is kept survives a restart; one key never reaches another's; bounds evict the
oldest and say so; bad input is a 4xx naming the field."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response

from tests.conftest import MODEL
from tests.server_proc import ServerProcess, serving

GREEDY: dict[str, Any] = {"temperature": 0, "max_output_tokens": 32}
# SmolLM2 counts on for hundreds of tokens: a response still running when the test acts on it.
LONG: dict[str, Any] = {"input": "Count from 1 to 1000, separated by commas.", "temperature": 0,
                        "max_output_tokens": 900}  # fmt: skip
ALICE, BOB = "sk-alice-0123456789abcdef", "sk-bob-0123456789abcdef"


def _sdk(srv: ServerProcess, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=key, max_retries=0, timeout=120)


def _error(exc: openai.APIStatusError) -> str:
    message = exc.response.json()["error"]
    assert isinstance(message, str)
    return message


def _until_finished(client: openai.OpenAI, response_id: str, bound_s: float = 120) -> Response:
    """Poll as OpenAI's guide does, until the response leaves queued and in_progress."""
    end = time.monotonic() + bound_s
    while True:
        got = client.responses.retrieve(response_id)
        if got.status not in ("queued", "in_progress") or time.monotonic() > end:
            return got
        time.sleep(0.1)


def _until_running(client: openai.OpenAI, response_id: str) -> None:
    """Until its first tokens are out (the worker has it)."""
    end = time.monotonic() + 60
    while time.monotonic() < end:
        events = client.responses.retrieve(response_id, stream=True)
        for ev in events:
            if ev.type == "response.output_text.delta":
                events.close()
                return
    raise AssertionError(f"{response_id} never started")


def _smol_workers(srv: ServerProcess) -> list[dict[str, Any]]:
    rows = httpx.get(f"{srv.base_url}/v1/workers", timeout=10).json()["data"]
    return [w for w in rows if w["model"] == MODEL]


# ---- the shared server ----------------------------------------------------------------


def test_a_stored_response_is_retrieved_listed_and_deleted(client: openai.OpenAI, server: ServerProcess) -> None:
    items = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Hello Ada."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is my name?"}]}]  # fmt: skip
    made = client.responses.create(model=MODEL, instructions="Be brief.", input=items, **GREEDY)  # type: ignore[arg-type]
    got = client.responses.retrieve(made.id)
    assert (got.id, got.status, got.output_text, got.usage) == (made.id, made.status, made.output_text, made.usage)
    listed = client.responses.input_items.list(made.id, order="asc")
    assert [i.type for i in listed.data] == ["message"] * 3 and listed.has_more is False
    assert [i.role for i in listed.data] == ["user", "assistant", "user"]  # type: ignore[union-attr]
    assert all(i.id for i in listed.data) and listed.data[0].content[0].text == "My name is Ada."  # type: ignore[union-attr, index]
    newest = client.responses.input_items.list(made.id, limit=2)  # newest first by default, as at OpenAI
    assert [i.id for i in newest.data] == [listed.data[2].id, listed.data[1].id] and newest.has_more is True
    rest = client.responses.input_items.list(made.id, limit=2, after=newest.data[-1].id)
    assert [i.id for i in rest.data] == [listed.data[0].id] and rest.has_more is False
    raw = httpx.get(f"{server.base_url}/v1/responses/{made.id}/input_items", params={"limit": 1}, timeout=10).json()
    assert raw["object"] == "list" and raw["first_id"] == raw["last_id"] == listed.data[2].id
    client.responses.delete(made.id)
    for call in (lambda: client.responses.retrieve(made.id), lambda: client.responses.input_items.list(made.id),
                 lambda: client.responses.delete(made.id)):  # fmt: skip
        with pytest.raises(openai.NotFoundError) as nf:
            call()
        assert made.id in _error(nf.value) and "response_id" in _error(nf.value)


def test_a_background_response_is_polled_to_completed_and_replayed(client: openai.OpenAI) -> None:
    queued = client.responses.create(model=MODEL, input="Hi!", background=True, **GREEDY)
    assert queued.status in ("queued", "in_progress") and queued.background is True and queued.output == []
    done = _until_finished(client, queued.id)
    assert done.status in ("completed", "incomplete") and done.output_text and done.usage is not None
    assert done.background is True and done.id == queued.id and done.created_at == queued.created_at
    whole = list(client.responses.retrieve(queued.id, stream=True))
    seqs = [e.sequence_number for e in whole]
    assert seqs == list(range(len(seqs))) and whole[0].type == "response.created"
    assert whole[-1].type == f"response.{done.status}" and whole[-1].response.output_text == done.output_text  # type: ignore[union-attr]
    assert "".join(e.delta for e in whole if e.type == "response.output_text.delta") == done.output_text
    tail = list(client.responses.retrieve(queued.id, stream=True, starting_after=3))
    assert [e.sequence_number for e in tail] == seqs[4:]
    assert list(client.responses.retrieve(queued.id, stream=True, starting_after=seqs[-1])) == []
    with pytest.raises(openai.BadRequestError) as past:
        client.responses.retrieve(queued.id, stream=True, starting_after=10**12)
    assert "starting_after" in _error(past.value) and f"0 to {seqs[-1]}" in _error(past.value)
    # cancelling a finished background response is answered with it, unchanged, as at OpenAI
    again = client.responses.cancel(queued.id)
    assert (again.status, again.output_text) == (done.status, done.output_text)


def test_a_background_stream_can_be_left_and_resumed(client: openai.OpenAI) -> None:
    stream = client.responses.create(model=MODEL, background=True, stream=True, **LONG | {"max_output_tokens": 60})
    first = []
    for ev in stream:
        first.append(ev)
        if len(first) == 6:
            break
    stream.close()  # the client leaves; the response runs on
    rid = first[0].response.id
    rest = list(client.responses.retrieve(rid, stream=True, starting_after=first[-1].sequence_number))
    seqs = [e.sequence_number for e in [*first, *rest]]
    assert seqs == list(range(len(seqs))) and rest[-1].type in ("response.completed", "response.incomplete")
    done = client.responses.retrieve(rid)
    text = "".join(e.delta for e in [*first, *rest] if e.type == "response.output_text.delta")
    assert text == done.output_text and done.usage is not None and done.usage.output_tokens > 6


def test_cancelling_a_running_background_response_frees_its_worker(
    client: openai.OpenAI, server: ServerProcess
) -> None:
    made = client.responses.create(model=MODEL, background=True, **LONG)
    _until_running(client, made.id)
    cancelled = client.responses.cancel(made.id)
    assert cancelled.status == "cancelled" and cancelled.error is None
    assert client.responses.retrieve(made.id).status == "cancelled"
    assert client.responses.cancel(made.id).status == "cancelled"  # idempotent
    # the worker stopped the generation: it is idle, nothing in flight (no wait: the cancel waited for it)
    # (the shared server may hold more than one of its workers, at other contexts: every one is idle)
    states = [(w["state"], w["inflight"]) for w in _smol_workers(server)]
    assert states and all(s == ("idle", 0) for s in states), states
    text = cancelled.output_text
    assert text and cancelled.output[0].status == "incomplete"  # type: ignore[union-attr]
    # what it made is kept as it stopped; its replay ends there
    events = list(client.responses.retrieve(made.id, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta").startswith(text[:10])


def test_input_tokens_are_the_prompt_tokens_of_the_same_request(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"instructions": "Be brief.", "input": [{"role": "user", "content": "What is 2+2?"}]}
    counted = client.responses.input_tokens.count(model=MODEL, **kw)
    answered = client.responses.create(model=MODEL, store=False, **kw, **GREEDY)
    assert answered.usage is not None and counted.object == "response.input_tokens"
    assert counted.input_tokens == answered.usage.input_tokens > 0
    # with previous_response_id, the earlier turns count too, as they would be sent
    after = client.responses.create(model=MODEL, input="Hello.", **GREEDY)
    more = client.responses.input_tokens.count(model=MODEL, previous_response_id=after.id, input="And then?")
    follow = client.responses.create(model=MODEL, previous_response_id=after.id, input="And then?", **GREEDY)
    assert follow.usage is not None and more.input_tokens == follow.usage.input_tokens


def test_a_conversation_is_read_and_extended_by_its_responses(client: openai.OpenAI, server: ServerProcess) -> None:
    conv = client.conversations.create(items=[{"role": "user", "content": "My name is Ada."}], metadata={"k": "v"})
    assert conv.id.startswith("conv_") and conv.metadata == {"k": "v"}
    assert client.conversations.retrieve(conv.id).created_at == conv.created_at
    added = client.conversations.items.create(conv.id, items=[{"role": "assistant", "content": "Hello Ada."}])
    assert [i.type for i in added.data] == ["message"]
    answered = client.responses.create(model=MODEL, conversation=conv.id, input="What is my name?", **GREEDY)
    assert answered.conversation is not None and answered.conversation.id == conv.id
    same = client.responses.create(model=MODEL, store=False, input=[{"role": "user", "content": "My name is Ada."},
                                   {"role": "assistant", "content": "Hello Ada."},
                                   {"role": "user", "content": "What is my name?"}], **GREEDY)  # fmt: skip
    assert answered.usage is not None and same.usage is not None
    assert answered.usage.input_tokens == same.usage.input_tokens  # the items are the history
    items = client.conversations.items.list(conv.id, order="asc")
    assert [getattr(i, "role", None) for i in items.data] == ["user", "assistant", "user", "assistant"]
    assert items.data[-1].id == answered.output[-1].id  # the response's output item, appended
    second = items.data[1].id
    assert second is not None
    one = client.conversations.items.retrieve(second, conversation_id=conv.id)
    assert one.id == second
    assert client.conversations.items.delete(second, conversation_id=conv.id).id == conv.id
    assert len(client.conversations.items.list(conv.id).data) == 3
    assert client.conversations.update(conv.id, metadata={"k": "w"}).metadata == {"k": "w"}
    assert client.conversations.delete(conv.id).deleted is True
    with pytest.raises(openai.NotFoundError) as nf:
        client.responses.create(model=MODEL, conversation={"id": conv.id}, input="Hi", **GREEDY)
    assert "conversation" in _error(nf.value)


def test_bad_input_is_a_4xx_naming_the_field(client: openai.OpenAI, server: ServerProcess) -> None:
    made = client.responses.create(model=MODEL, input="Hi!", **GREEDY)
    conv = client.conversations.create()
    base = server.base_url
    cases: list[tuple[str, str, dict[str, Any] | None, dict[str, Any] | None, int, str]] = [
        ("GET", f"/v1/responses/{made.id}/input_items", {"limit": 0}, None, 400, "limit"),
        ("GET", f"/v1/responses/{made.id}/input_items", {"limit": 101}, None, 400, "limit"),
        ("GET", f"/v1/responses/{made.id}/input_items", {"limit": "many"}, None, 400, "limit"),
        ("GET", f"/v1/responses/{made.id}/input_items", {"order": "sideways"}, None, 400, "order"),
        ("GET", f"/v1/responses/{made.id}/input_items", {"after": "msg_nope"}, None, 400, "after"),
        ("GET", f"/v1/responses/{made.id}", {"stream": "true"}, None, 400, "stream"),  # not a background one
        ("GET", f"/v1/responses/{made.id}", {"stream": "true", "starting_after": "x"}, None, 400, "starting_after"),
        ("POST", f"/v1/responses/{made.id}/cancel", None, None, 400, "response_id"),
        ("POST", "/v1/responses/resp_nope/cancel", None, None, 404, "response_id"),
        ("GET", "/v1/responses/resp_nope/input_items", None, None, 404, "response_id"),
        ("POST", "/v1/responses", None, {"model": MODEL, "input": "x", "background": True, "store": False}, 400,
         "background"),
        ("POST", "/v1/responses", None, {"model": MODEL, "input": "x", "conversation": conv.id,
                                         "previous_response_id": made.id}, 400, "previous_response_id"),
        ("POST", "/v1/responses", None, {"model": MODEL, "input": "x", "conversation": "conv_nope"}, 404,
         "conversation"),
        ("POST", "/v1/responses/input_tokens", None, {"input": "x"}, 400, "model"),
        ("POST", "/v1/conversations", None, {"items": [{"type": "item_reference"}]}, 400, "items[0]"),
        ("POST", "/v1/conversations", None, {"items": [{"role": "user", "content": "x"}] * 21}, 400, "items"),
        ("POST", f"/v1/conversations/{conv.id}/items", None, {"items": "x"}, 400, "items"),
        ("GET", f"/v1/conversations/{conv.id}/items", {"limit": 500}, None, 400, "limit"),
        ("GET", f"/v1/conversations/{conv.id}/items", {"after": "msg_nope"}, None, 400, "after"),
        ("GET", f"/v1/conversations/{conv.id}/items/msg_nope", None, None, 404, "item_id"),
        ("GET", "/v1/conversations/conv_nope", None, None, 404, "conversation_id"),
        ("DELETE", "/v1/conversations/conv_nope", None, None, 404, "conversation_id"),
    ]  # fmt: skip
    for method, path, params, body, status, named in cases:
        r = httpx.request(method, f"{base}{path}", params=params, json=body, timeout=60)
        assert r.status_code == status, (path, params, body, r.text)
        assert named in r.json()["error"], (named, r.json())
    assert client.responses.retrieve(made.id).output_text == made.output_text  # nothing lost


# ---- keys, bounds, restarts: servers of their own -------------------------------------------


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("keyed")
    keys = data / "keys"
    keys.write_text(f"{ALICE} alice\n{BOB} bob\n")
    with serving(data, "--nctx", "1024", "--api-key-file", str(keys), "--responses-store-max", "3",
                 "--conversations-store-max", "2", "--responses-background-per-key", "1") as srv:  # fmt: skip
        yield srv


def test_one_key_never_reaches_another_keys_responses_or_conversations(keyed: ServerProcess) -> None:
    alice, bob = _sdk(keyed, ALICE), _sdk(keyed, BOB)
    mine = alice.responses.create(model=MODEL, input="Hi!", **GREEDY)
    back = alice.responses.create(model=MODEL, input="Hi!", background=True, **GREEDY)
    conv = alice.conversations.create(items=[{"role": "user", "content": "secret"}])

    def absent(call: Any, field: str, the_id: str) -> str:
        with pytest.raises(openai.NotFoundError) as nf:
            call()
        message = _error(nf.value)
        assert field in message and the_id in message
        return message.replace(the_id, "ID")

    for rid in (mine.id, back.id):
        theirs = absent(lambda rid=rid: bob.responses.retrieve(rid), "response_id", rid)
        assert theirs == absent(lambda: bob.responses.retrieve("resp_never"), "response_id", "resp_never")
        absent(lambda rid=rid: bob.responses.input_items.list(rid), "response_id", rid)
        absent(lambda rid=rid: bob.responses.cancel(rid), "response_id", rid)
        absent(lambda rid=rid: bob.responses.delete(rid), "response_id", rid)
        absent(lambda rid=rid: bob.responses.retrieve(rid, stream=True), "response_id", rid)
        absent(lambda rid=rid: bob.responses.create(model=MODEL, previous_response_id=rid, input="And?", **GREEDY),
               "previous_response_id", rid)  # fmt: skip
        absent(lambda rid=rid: bob.responses.input_tokens.count(model=MODEL, previous_response_id=rid, input="x"),
               "previous_response_id", rid)  # fmt: skip
    absent(lambda: bob.conversations.retrieve(conv.id), "conversation_id", conv.id)
    absent(lambda: bob.conversations.items.list(conv.id), "conversation_id", conv.id)
    absent(lambda: bob.conversations.items.create(conv.id, items=[{"role": "user", "content": "x"}]),
           "conversation_id", conv.id)  # fmt: skip
    absent(lambda: bob.conversations.delete(conv.id), "conversation_id", conv.id)
    absent(
        lambda: bob.responses.create(model=MODEL, conversation=conv.id, input="x", **GREEDY), "conversation", conv.id
    )
    # nothing of alice's was touched
    assert alice.responses.retrieve(mine.id).output_text == mine.output_text
    assert _until_finished(alice, back.id).status in ("completed", "incomplete")
    assert len(alice.conversations.items.list(conv.id).data) == 1


def test_past_the_bound_the_oldest_is_evicted_and_said(keyed: ServerProcess) -> None:
    alice, bob = _sdk(keyed, ALICE), _sdk(keyed, BOB)
    bobs = bob.responses.create(model=MODEL, input="Hi!", **GREEDY)
    made = []
    evicted: list[str] = []
    for _ in range(5):  # past alice's bound of 3
        raw = alice.responses.with_raw_response.create(model=MODEL, input="Hi!", temperature=0, max_output_tokens=2)
        made.append(raw.parse().id)
        evicted += [i for i in raw.headers.get("GenieX-Evicted-Responses", "").split(",") if i]
    assert all(i not in made[-3:] for i in evicted) and set(made[:2]) <= set(evicted)
    for gone in made[:2]:
        with pytest.raises(openai.NotFoundError):
            alice.responses.retrieve(gone)
    assert [alice.responses.retrieve(i).id for i in made[-3:]] == made[-3:]
    assert bob.responses.retrieve(bobs.id).id == bobs.id  # one key's flood evicts only its own
    assert all(f'"response": "{gone}"' in keyed.log() for gone in made[:2])
    convs = [alice.conversations.with_raw_response.create() for _ in range(3)]
    assert convs[2].headers["GenieX-Evicted-Conversations"] == convs[0].parse().id
    with pytest.raises(openai.NotFoundError):
        alice.conversations.retrieve(convs[0].parse().id)


def test_background_responses_past_the_keys_bound_are_a_429(keyed: ServerProcess) -> None:
    alice, bob = _sdk(keyed, ALICE), _sdk(keyed, BOB)
    running = alice.responses.create(model=MODEL, background=True, **LONG)
    with pytest.raises(openai.RateLimitError) as over:
        alice.responses.create(model=MODEL, background=True, **LONG)
    assert "background" in _error(over.value) and "--responses-background-per-key" in _error(over.value)
    other = bob.responses.create(model=MODEL, background=True, input="Hi!", **GREEDY)  # bob's own bound
    assert alice.responses.cancel(running.id).status == "cancelled"
    assert _until_finished(bob, other.id).status in ("completed", "incomplete")


def test_a_restart_keeps_what_finished_and_says_what_did_not(tmp_path: Path) -> None:
    data = tmp_path / "data"
    args = ("--nctx", "1024", "--drain-timeout-s", "0.5")
    with serving(data, *args) as first:
        c = _sdk(first)
        kept = c.responses.create(model=MODEL, input="Hi!", **GREEDY)
        kept_items = c.responses.input_items.list(kept.id).data
        conv = c.conversations.create(items=[{"role": "user", "content": "Remember me."}])
        drained = c.responses.create(model=MODEL, background=True, **LONG)
        _until_running(c, drained.id)
        first.stop(signal.SIGTERM)  # the drain runs out of time with it still running
        assert "background responses cancelled" in first.log_path.read_text()
    with serving(data, *args) as second:
        c = _sdk(second)
        again = c.responses.retrieve(kept.id)
        assert (again.status, again.output_text, again.usage) == (kept.status, kept.output_text, kept.usage)
        assert [i.id for i in c.responses.input_items.list(kept.id).data] == [i.id for i in kept_items]
        assert len(c.conversations.items.list(conv.id).data) == 1
        after = c.responses.create(model=MODEL, previous_response_id=kept.id, input="Thanks.", **GREEDY)
        assert after.usage is not None and kept.usage is not None
        assert after.usage.input_tokens > kept.usage.input_tokens + kept.usage.output_tokens
        stopped = c.responses.retrieve(drained.id)
        assert stopped.status == "cancelled" and stopped.error is not None and "drain" in stopped.error.message
        killed = c.responses.create(model=MODEL, background=True, **LONG)
        _until_running(c, killed.id)
        second.stop(signal.SIGKILL)
    with serving(data, *args) as third:
        c = _sdk(third)
        lost = c.responses.retrieve(killed.id)
        assert lost.status == "failed" and lost.error is not None
        assert lost.error.message == "the server stopped before it finished"
        assert c.responses.retrieve(kept.id).output_text == kept.output_text
