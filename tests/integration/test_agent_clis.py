"""The real agent CLIs, from npm, each completing one turn against the real server and model:
Codex (`codex exec`, a custom provider with `wire_api = "responses"`), Claude Code (`claude -p
--bare`, `ANTHROPIC_BASE_URL`) and pi (`pi -p`, a custom provider speaking OpenAI Chat
Completions). Their current
releases are installed and cached by tests/agent_clis.py; the versions run are printed at the end
of the session (tests/conftest.py). Agent CLIs change what they send every few weeks: this module
is how the suite notices.

A turn here is what each CLI calls complete: its exit status 0 and its own record of the turn
(Codex's `turn.completed` event, Claude Code's result without error, pi's `agent_end`) holding an
answer. What the 135M model says is not judged; that the server took each CLI's whole request
(its tools, hosted or namespaced, and its extra fields) and answered it in the shape the CLI reads
is.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import agent_clis
from tests.conftest import MODEL
from tests.server_proc import ServerProcess, serving

PROMPT = "Reply with one short friendly sentence. Do not use any tool."
NCTX = 8192
TURN_TIMEOUT_S = 300  # a CLI's first request is 1,200 to 4,500 prompt tokens, on two cores busy with other tests
# Codex's own instructions are 4,000 tokens, which a 135M model on two cores takes a minute and a
# half to read (9,100 in all); a model instructions file of one line is Codex's way to replace them,
# and without its goal tools (800 tokens) the request still holds its namespace and web search.
CODEX_INSTRUCTIONS = "You are a coding agent in a terminal. Answer briefly."
# Codex's own switches for the prose it adds as developer and user messages (the skills list, the
# sandbox's rules, the environment: 700 of the 4,700 tokens left): plain text, which proves nothing
# the one-line instructions and the prompt do not, while every tool and extra field is still sent.
CODEX_TRIM = ("skills.include_instructions=false", "include_permissions_instructions=false",
              "include_environment_context=false")  # fmt: skip
# pi's own system prompt (600 of its 1,500 tokens) lists its tools again in prose; its flag replaces
# it, and the tools themselves are still sent as Chat Completions tools.
PI_SYSTEM_PROMPT = "You are a coding assistant in a terminal. Answer briefly."
# How Codex ends a turn whose response came back `incomplete` at the token limit.
LENGTH_LIMITED = "Incomplete response returned, reason: max_output_tokens"
# How Claude Code names a turn whose answer stopped at its CLAUDE_CODE_MAX_OUTPUT_TOKENS.
CLAUDE_LENGTH_LIMITED = "max_output_tokens"


@pytest.fixture(scope="module")
def clis() -> agent_clis.Clis:
    found = agent_clis.install()
    if isinstance(found, str):
        pytest.skip(found)
    agent_clis.record_versions({name: found.version(name) for name in agent_clis.COMMANDS})
    return found


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # One sequence of SmolLM2's whole trained context: Codex's first request is 4,500 tokens. Codex
    # sends no output limit: the models file gives the model one, so that a rambling answer (the
    # 135M model's, now and then) ends in seconds, not after the default 2,048 tokens (200 s in CI).
    data = tmp_path_factory.mktemp("agents")
    models = data / "models.toml"
    models.write_text(f'["{MODEL}"]\nmax_tokens = 256\n')
    with serving(data, "--nctx", str(NCTX), "--parallel", "1", "--models-file", str(models)) as srv:
        yield srv


def run(cmd: list[str], env: dict[str, str], cwd: Path, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=TURN_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0 or not check, (
        f"{cmd[0]} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return done


def workdir(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "README.md").write_text("A test project.\n")
    return tmp_path / "work"


def test_codex_exec_completes_a_turn_over_responses(clis: agent_clis.Clis, server: ServerProcess,
                                                    tmp_path: Path) -> None:  # fmt: skip
    cwd = workdir(tmp_path)
    # Codex's own retries stay on, as a user has them. A sampled answer that runs to the token limit
    # comes back `incomplete`, and Codex ends the turn with LENGTH_LIMITED.
    provider = f'{{name="GenieX", base_url="{server.base_url}/v1", wire_api="responses", env_key="GENIEX_KEY"}}'
    instructions = tmp_path / "home" / "instructions.md"
    instructions.write_text(CODEX_INSTRUCTIONS)
    env = clis.env(tmp_path / "home", CODEX_HOME=str(tmp_path / "home"), GENIEX_KEY="unused")
    done = run([str(clis.bin / "codex"), "exec", "--json", "--skip-git-repo-check", "--ephemeral", "--sandbox",
                "read-only", "-c", "model_provider=geniex", "-c", f"model_providers.geniex={provider}",
                "-c", f'model_instructions_file="{instructions}"', *(a for c in CODEX_TRIM for a in ("-c", c)),
                "--disable", "goals", "-m", MODEL, PROMPT],
               env, cwd, check=False)  # fmt: skip
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    kinds = [e.get("type") for e in events]
    failed = [e for e in events if e.get("type") == "turn.failed"]
    if failed and failed[0].get("error", {}).get("message") == LENGTH_LIMITED:
        # The sampled answer ran to the token limit (the 135M model rambles, now and then): the server
        # sent a well-formed `incomplete` response, which Codex reports as such rather than retrying
        # (this Codex also says it first as an `error` event of the same message, and nothing else).
        others = [e for e in events if e.get("type") == "error" and e.get("message") != LENGTH_LIMITED]
        assert done.returncode == 1 and not others, done.stdout[-4000:]
    else:
        assert done.returncode == 0, f"codex exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        assert "turn.completed" in kinds and not failed and "error" not in kinds, done.stdout[-4000:]
        answers = [e["item"] for e in events if e.get("type") == "item.completed" and
                   e.get("item", {}).get("type") == "agent_message"]  # fmt: skip
        assert answers and answers[-1].get("text"), done.stdout[-4000:]
    # Codex offers OpenAI's hosted web search beside its functions: served without it, and said so.
    assert "tools not offered" in server.log() and "web_search" in server.log()


def test_claude_code_completes_a_turn_over_messages(clis: agent_clis.Clis, server: ServerProcess,
                                                    tmp_path: Path) -> None:  # fmt: skip
    cwd = workdir(tmp_path)
    # Claude Code asks for 32,000 output tokens, so the models file's default never applies: its own
    # cap ends a rambling answer (the 135M model's, now and then: 6,268 tokens, 300 s, once in CI).
    env = clis.env(tmp_path / "home", ANTHROPIC_BASE_URL=server.base_url, ANTHROPIC_API_KEY="unused",
                   DISABLE_AUTOUPDATER="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                   CLAUDE_CODE_MAX_OUTPUT_TOKENS="256")  # fmt: skip
    done = run([str(clis.bin / "claude"), "-p", "--bare", "--output-format", "json", "--model", MODEL, PROMPT],
               env, cwd, check=False)  # fmt: skip
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result.get("type") == "result", done.stdout[-4000:]
    if result.get("api_error") == CLAUDE_LENGTH_LIMITED:
        # The sampled answer ran to that cap: the server ended it with a well-formed `max_tokens` stop,
        # which Claude Code reports as an error of its own name (exit 1) after reading the answer.
        assert done.returncode == 1 and result["usage"]["output_tokens"] > 0, done.stdout[-4000:]
    else:
        assert done.returncode == 0, f"claude exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        assert result.get("is_error") is False, done.stdout[-4000:]
        assert isinstance(result.get("result"), str) and result["result"].strip(), done.stdout[-4000:]


def test_pi_completes_a_turn_over_chat_completions(clis: agent_clis.Clis, server: ServerProcess,
                                                   tmp_path: Path) -> None:  # fmt: skip
    cwd = workdir(tmp_path)
    config = tmp_path / "home" / ".pi" / "agent"
    config.mkdir(parents=True)
    (config / "models.json").write_text(json.dumps({"providers": {"geniex": {
        "baseUrl": f"{server.base_url}/v1", "api": "openai-completions", "apiKey": "unused",
        "models": [{"id": MODEL, "contextWindow": NCTX, "maxTokens": 256}]}}}))  # fmt: skip
    # Its compaction (a summarising request) starts when a turn leaves less than 16k tokens of context free.
    (config / "settings.json").write_text(json.dumps({"compaction": {"enabled": False}}))
    done = run([str(clis.bin / "pi"), "--offline", "--no-session", "-p", "--mode", "json", "--provider", "geniex",
                "--model", MODEL, "--system-prompt", PI_SYSTEM_PROMPT, PROMPT], clis.env(tmp_path / "home"), cwd)  # fmt: skip
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    ends = [e for e in events if e.get("type") == "agent_end"]
    assert ends, done.stdout[-4000:]
    answer = ends[-1]["messages"][-1]
    # The server samples (temperature 0.8, pi sends none): the small model sometimes rambles to the
    # token limit, which ends the turn as surely as its end token does.
    assert answer["role"] == "assistant" and answer.get("stopReason") in ("stop", "length"), done.stdout[-4000:]
    assert any(part.get("type") == "text" and part.get("text", "").strip() for part in answer["content"])


def test_every_cli_request_was_answered_without_a_server_error(server: ServerProcess) -> None:
    """Whatever the CLIs sent, nothing was a 5xx (a refusal of theirs would have failed their test)."""
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
    assert '"status": 500' not in server.log() and '"status":500' not in server.log()
