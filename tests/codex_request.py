"""A `/v1/responses` request in the shape Codex CLI 0.171 sends (`codex exec`, a custom provider
with `wire_api = "responses"`), written from its fields: the texts and schemas here are short
stand-ins, not Codex's prompt. What matters is the shape the server must take whole:

- `input`: message items with ids, two `developer` turns (one of two `input_text` parts), then
  two `user` turns; no `instructions`;
- `tools`: flat function tools (`strict: false`), a `namespace` tool grouping five function tools,
  more function tools, and OpenAI's hosted `web_search` with `external_web_access: false`;
- `tool_choice: "auto"`, `parallel_tool_calls`, `reasoning: {"summary": "auto"}`, `store: false`,
  `include: ["reasoning.encrypted_content"]`, `prompt_cache_key` (the session's id) and a
  `client_metadata` object; `stream: true`.
"""

from __future__ import annotations

from typing import Any

SESSION = "01a2336e-6d39-7ef2-9ca7-fbf3a70ae6fc"


# fmt: off
def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "name": name, "description": description, "strict": False,
            "parameters": {"type": "object", "properties": properties, "required": required,
                           "additionalProperties": False}}


_TEXT = {"type": "string"}

SUB_AGENTS = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for starting and managing helper agents.",
    "tools": [
        _fn("spawn_agent", "Start a helper agent on a task.", {"message": {**_TEXT, "description": "The task."},
            "fork_context": {"type": "boolean"}}, ["message"]),
        _fn("send_input", "Send a message to a helper agent.", {"target": _TEXT, "message": _TEXT,
            "interrupt": {"type": "boolean"}}, ["target", "message"]),
        _fn("wait_agent", "Wait for helper agents.", {"targets": {"type": "array", "items": _TEXT},
            "timeout_ms": {"type": "number"}}, ["targets"]),
        _fn("resume_agent", "Resume a helper agent.", {"id": _TEXT}, ["id"]),
        _fn("close_agent", "Close a helper agent.", {"target": _TEXT}, ["target"]),
    ],
}


def request(model: str, text: str = "Say hi.") -> dict[str, Any]:
    return {
        "model": model,
        "input": [
            {"type": "message", "id": "msg_1", "role": "developer",
             "content": [{"type": "input_text", "text": "You are a coding agent in a terminal. Be brief."}]},
            {"type": "message", "id": "msg_2", "role": "developer",
             "content": [{"type": "input_text", "text": "<permissions>read-only sandbox</permissions>"},
                         {"type": "input_text", "text": "<skills>none</skills>"}]},
            {"type": "message", "id": "msg_3", "role": "user",
             "content": [{"type": "input_text", "text": "<environment_context>cwd: /work</environment_context>"}]},
            {"type": "message", "id": "msg_4", "role": "user", "content": [{"type": "input_text", "text": text}]},
        ],
        "tools": [
            _fn("exec_command", "Runs a command.", {"cmd": {**_TEXT, "description": "Shell command."},
                "workdir": _TEXT, "yield_time_ms": {"type": "number"}}, ["cmd"]),
            _fn("write_stdin", "Writes to a running command.", {"session_id": {"type": "number"}, "chars": _TEXT},
                ["session_id"]),
            _fn("request_user_input", "Asks the user.", {"question": _TEXT}, ["question"]),
            _fn("view_image", "Shows an image file.", {"path": _TEXT}, ["path"]),
            SUB_AGENTS,
            _fn("get_goal", "Reads the goal.", {}, []),
            _fn("create_goal", "Sets the goal.", {"objective": _TEXT}, ["objective"]),
            _fn("update_goal", "Updates the goal.", {"status": {"type": "string", "enum": ["done", "blocked"]}},
                ["status"]),
            {"type": "web_search", "external_web_access": False},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": SESSION,
        "client_metadata": {"session_id": SESSION, "thread_id": SESSION, "turn_id": "01a2336e-6e49",
                            "x-codex-turn-metadata": '{"request_kind":"turn","sandbox":"seccomp"}'},
        "stream": True,
    }
# fmt: on
