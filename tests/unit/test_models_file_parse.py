"""The models file (`--models-file`): what it refuses, each refusal naming the file, the table and
the key; aliases and disabled models in the store's resolution; defaults on a request; reloads."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.errors import ModelNotFound
from gateway.models.models_file import MAX_FILE_BYTES, ModelsFile, ModelsFileError, parse, read
from gateway.models.store import ModelEntry, ModelStore
from protocol.chat import ChatMessage, ChatRequest
from protocol.completions import CompletionRequest

A = "org/alpha:Q4_0"
B = "org/beta:Q4_0"


def _entry(model_id: str) -> ModelEntry:
    org_repo, precision = model_id.split(":")
    org, repo = org_repo.split("/")
    return ModelEntry(id=model_id, org=org, repo=repo, precision=precision, engine="llama_cpp",
                      path=f"/nonexistent/{repo}.gguf", size=1, created=0, bundled=True)  # fmt: skip


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "data", bundled=[_entry(A), _entry(B)])


def refused(text: str, store: ModelStore, *names: str) -> str:
    with pytest.raises(ModelsFileError) as err:
        parse(text, "/etc/geniex/models.toml", store)
    message = str(err.value)
    assert message.startswith("/etc/geniex/models.toml: "), message
    for name in names:
        assert name in message, message
    return message


def test_a_valid_file_gives_aliases_defaults_and_the_table_it_came_from(store: ModelStore, tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(f'["{A}"]\naliases = ["gpt-4o-mini", "small"]\ntemperature = 0\nnctx = 8192\n'
                    f'system = "You are terse."\nkeep_alive = -1\ncache_type_k = "q8_0"\n'
                    f'["org/beta"]\nhidden = true\n')  # fmt: skip
    models = ModelsFile(path, store)
    assert models.target("GPT-4o-mini") == A and models.target("other") == "other"
    assert models.aliases(A) == ["gpt-4o-mini", "small"]
    assert models.defaults(A) == {"nctx": 8192, "temperature": 0.0, "system": "You are terse.", "keep_alive": -1.0,
                                  "cache_type_k": "q8_0"}  # fmt: skip
    assert models.source(A) == f"{path} [{A}]"
    assert models.source(B) == f"{path} [org/beta]"  # a table may leave the precision out; it names the model's id
    assert models.hidden(B) and not models.hidden(A) and models.is_hidden(B)
    assert not models.is_disabled(B)
    assert models.describe("org/none:Q4_0") is None and models.defaults("org/none:Q4_0") == {}


def test_a_file_larger_than_a_megabyte_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.toml"
    with path.open("wb") as f:
        f.truncate(10 * MAX_FILE_BYTES)  # 10 MiB, sparse: reading it would show in the message's absence
    with pytest.raises(ModelsFileError, match=r"big\.toml: 10485760 bytes, more than the 1 MiB .*not read"):
        read(path, None)


def test_ten_thousand_aliases_are_refused(store: ModelStore) -> None:
    aliases = ", ".join(f'"a{i}"' for i in range(10_000))
    refused(f'["{A}"]\naliases = [{aliases}]\n', store, "10000 aliases", "1000")


def test_an_alias_naming_its_own_model_is_refused(store: ModelStore) -> None:
    refused(f'["{A}"]\naliases = ["{A}"]\n', store, f"table [{A}]", "key `aliases`", "its own table's model id")


def test_an_alias_naming_another_alias_a_cycle_is_refused(store: ModelStore) -> None:
    # aliases name model ids directly: an alias that is another table's name would chain (or loop)
    refused(f'["{A}"]\naliases = ["{B}"]\n["{B}"]\naliases = ["{A}"]\n', store, f"table [{A}]", "key `aliases`",
            "never itself or another alias")  # fmt: skip


def test_an_alias_equal_to_an_installed_model_is_refused(store: ModelStore) -> None:
    refused(f'["{A}"]\naliases = ["{B}"]\n', store, f"table [{A}]", "key `aliases`", "an installed model's id")
    refused(f'["{A}"]\naliases = ["org/beta"]\n', store, "key `aliases`", "an installed model's id")


def test_an_alias_in_two_tables_is_refused(store: ModelStore) -> None:
    refused(f'["{A}"]\naliases = ["x"]\n["{B}"]\naliases = ["X"]\n', store, f"table [{B}]", "key `aliases`",
            f"also in table [{A}]")  # fmt: skip


def test_nul_in_a_key_a_table_name_or_an_alias_is_refused(store: ModelStore) -> None:
    refused(f'["{A}"]\n"nctx\\u0000" = 1\n', store, f"table [{A}]", "key 'nctx\\x00'", "NUL")
    refused('["org/alpha:Q4_0\\u0000"]\nnctx = 1\n', store, "table ['org/alpha:Q4_0\\x00']", "NUL")
    refused(f'["{A}"]\naliases = ["a\\u0000b"]\n', store, f"table [{A}]", "key `aliases`", "NUL")


def test_a_system_prompt_of_a_megabyte_is_refused(store: ModelStore) -> None:
    refused(f'["{A}"]\nsystem = "{"x" * (1 << 20)}"\n', store, f"table [{A}]", "key `system`", "64 KiB")


def test_an_unknown_key_is_refused(store: ModelStore) -> None:
    refused(f'["{A}"]\ntemprature = 0.5\n', store, f"table [{A}]", "key `temprature`", "unknown key")


def test_a_value_of_the_wrong_type_or_out_of_bounds_is_refused(store: ModelStore) -> None:
    refused(f'["{A}"]\nnctx = "8192"\n', store, f"table [{A}]", "key `nctx`", "expected `int`, got `str`")
    refused(f'["{A}"]\ntemperature = 3.0\n', store, "key `temperature`", "<= 2")
    refused(f'["{A}"]\nhidden = 1\n', store, "key `hidden`", "expected `bool`")
    refused(f'["{A}"]\ncache_type_k = "q9_9"\n', store, "key `cache_type_k`", "q9_9")
    refused(f'["{A}"]\nstop = [1]\n', store, "key `stop`")
    refused(f'["{A}"]\naliases = "gpt"\n', store, "key `aliases`", "expected `array`")


def test_a_table_that_names_no_installed_model_is_refused(store: ModelStore) -> None:
    refused('["org/typo:Q4_0"]\nnctx = 1\n', store, "table [org/typo:Q4_0]", "not an installed model")
    refused(f'nctx = 1\n["{A}"]\n', store, "`nctx` is not a table")
    refused(f'["{A}"]\nnctx = 1\n["org/alpha"]\nnctx = 2\n', store, "table [org/alpha]", "already has a table")
    refused(f'["{A}"\n', store, "not valid TOML")


def test_the_store_resolves_aliases_and_refuses_a_disabled_model_by_name(store: ModelStore, tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(f'["{A}"]\naliases = ["mini"]\n["{B}"]\naliases = ["off"]\ndisabled = true\n')
    store.models_file = ModelsFile(path, store)
    assert store.resolve("mini").id == A and store.resolve(A).id == A
    for name in (B, "off", "org/beta"):
        with pytest.raises(ModelNotFound, match=rf"model '{B}'.* is disabled by the models file .*models\.toml"):
            store.resolve(name)
    assert store.resolve(B, plain=True).id == B


def _chat(**fields: object) -> ChatRequest:
    return ChatRequest(model="mini", messages=[ChatMessage(role="user", content="hi")], **fields)  # type: ignore[arg-type]


def test_defaults_fill_what_the_request_left_unset_and_the_request_wins(store: ModelStore, tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(f'["{A}"]\ntemperature = 0\ntop_k = 5\nrepeat_penalty = 1.2\nmax_tokens = 7\nreasoning = false\n'
                    'system = "Be terse."\nstop = ["END"]\n')  # fmt: skip
    models, entry = ModelsFile(path, store), _entry(A)
    req = models.with_defaults(_chat(), entry)
    assert (req.temperature, req.top_k, req.repetition_penalty, req.max_tokens, req.enable_think, req.stop) == (
        0.0, 5, 1.2, 7, False, ["END"])  # fmt: skip
    assert [(m.role, m.content) for m in req.messages] == [("system", "Be terse."), ("user", "hi")]
    own = models.with_defaults(_chat(temperature=0.7, max_completion_tokens=3, enable_think=True, stop="X",
                                     repetition_penalty=1.0), entry)  # fmt: skip
    assert (own.temperature, own.max_tokens, own.max_completion_tokens, own.enable_think, own.stop) == (
        0.7, None, 3, True, "X")  # fmt: skip
    assert own.repetition_penalty == 1.0
    for role in ("system", "developer"):
        mine = ChatRequest(model="m", messages=[ChatMessage(role=role, content="Mine."),
                                                ChatMessage(role="user", content="hi")])  # fmt: skip
        assert [m.content for m in models.with_defaults(mine, entry).messages] == ["Mine.", "hi"]
    warmup = ChatRequest(model="m", messages=[])
    assert models.with_defaults(warmup, entry).messages == []  # a warm-up stays a warm-up
    text = models.with_defaults(CompletionRequest(model="m", prompt="x"), entry)
    assert (text.temperature, text.max_tokens, text.stop) == (0.0, 16, ["END"])  # a text completion's 16 stays
    assert models.with_defaults(_chat(), _entry(B)) == _chat()  # no table: unchanged


def test_an_invalid_new_version_keeps_the_one_before(store: ModelStore, tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(f'["{A}"]\naliases = ["mini"]\nnctx = 4096\n')
    models = ModelsFile(path, store)
    path.write_text(f'["{A}"]\naliases = ["mini"]\nnctx = "big"\n')
    assert not models.reload("test")
    assert models.target("mini") == A and models.defaults(A)["nctx"] == 4096
    path.write_text(f'["{B}"]\naliases = ["mini"]\nnctx = 8192\n')
    assert models.reload("test")
    assert models.target("mini") == B and models.defaults(A) == {}
    path.unlink()
    assert not models.reload("test") and models.target("mini") == B


def test_no_file_changes_nothing(store: ModelStore) -> None:
    models = ModelsFile()
    assert models.target("x") == "x" and models.preloads() == [] and not models.reload()
    assert models.with_defaults(_chat(), _entry(A)) == _chat()
