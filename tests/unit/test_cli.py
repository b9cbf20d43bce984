"""`geniex serve`'s flags: docs/operating.md's table is made from them, and every GENIEX_* variable is read or named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway import cli, cli_docs

OPERATING = Path(__file__).resolve().parents[2] / "docs" / "operating.md"


def test_the_settings_table_is_made_from_the_flags() -> None:
    """docs/operating.md's table is what `make docs` writes from gateway/ops/settings.py's declarations."""
    page = OPERATING.read_text()
    assert cli_docs.with_table(page) == page, "docs/operating.md's settings table is stale: run `make docs`"
    flags = {a.option_strings[0] for a in cli.serve_flags(cli.serve_parser())}
    assert set(re.findall(r"^\| `(--[a-z-]+)` \| `GENIEX_", page, flags=re.M)) == flags
    assert all(a.help and len(a.help) > 20 for a in cli.serve_flags(cli.serve_parser())), "every flag explains itself"


def test_every_flag_reads_its_geniex_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GENIEX_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("GENIEX_MAX_LOADED", "2")
    monkeypatch.setenv("GENIEX_PRELOAD", "a/b, c/d")
    monkeypatch.setenv("GENIEX_GRAMMAR_DIR", f"{tmp_path}/x:{tmp_path}/y")
    monkeypatch.setenv("GENIEX_STREAM_INTERVAL_MS", "0")
    p = cli.serve_parser()
    cli._env_defaults(p)
    args = p.parse_args([])
    assert args.data_dir == tmp_path and args.max_loaded == 2 and args.preload == ["a/b", "c/d"]
    assert args.grammar_dirs == [tmp_path / "x", tmp_path / "y"] and args.stream_interval_ms == 0
    assert p.parse_args(["--max-loaded", "3"]).max_loaded == 3  # the flag beats the variable


def test_a_bad_variable_value_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENIEX_NCTX", "lots")
    with pytest.raises(SystemExit, match="GENIEX_NCTX='lots' is not a valid value for --nctx"):
        cli._env_defaults(cli.serve_parser())
    monkeypatch.setenv("GENIEX_NCTX", "512")
    monkeypatch.setenv("GENIEX_LOG_LEVEL", "loud")
    with pytest.raises(SystemExit, match="GENIEX_LOG_LEVEL='loud': choose from debug"):
        cli._env_defaults(cli.serve_parser())


def test_unread_geniex_variables_are_named_with_a_suggestion() -> None:
    env = {"GENIEX_NCTX": "1", "GENIEX_DATADIR": "/x", "GENIEX_DATA_DIR": "/x", "GENIEX_LLAMA_LOG": "1",
           "GENIEX_NTCX": "1", "GENIEX_WHATEVER": "1", "HOME": "/root"}  # fmt: skip
    warnings = cli.unknown_env(cli.serve_parser(), env)
    assert warnings == [
        "GENIEX_NTCX is set, but no setting reads it (did you mean GENIEX_NCTX?)",
        "GENIEX_WHATEVER is set, but no setting reads it",
    ]


def test_compute_is_read_in_any_case_and_anything_else_stops_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli.serve_parser().parse_args(["--compute", "GPU"]).compute == "gpu"
    monkeypatch.setenv("GENIEX_COMPUTE", "Npu")
    p = cli.serve_parser()
    cli._env_defaults(p)
    assert p.parse_args([]).compute == "npu"
    monkeypatch.setenv("GENIEX_COMPUTE", "qairt")
    with pytest.raises(SystemExit, match="GENIEX_COMPUTE='qairt': choose from cpu, gpu, npu, hybrid"):
        cli._env_defaults(cli.serve_parser())


def test_a_renamed_flag_keeps_its_old_spelling_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    p = cli.serve_parser()
    assert p.parse_args(["--keep-alive-s", "7"]).keep_alive_s == 7 and capsys.readouterr().err == ""
    assert p.parse_args(["--keepalive", "5"]).keep_alive_s == 5
    assert "--keepalive is deprecated; use --keep-alive-s" in capsys.readouterr().err
    monkeypatch.setenv("GENIEX_MAX_BODY", "8")  # the old variable of --max-body-mb
    p = cli.serve_parser()
    cli._env_defaults(p)
    assert p.parse_args([]).max_body_mb == 8
    assert "GENIEX_MAX_BODY is deprecated; use GENIEX_MAX_BODY_MB" in capsys.readouterr().err
    assert cli.unknown_env(p, {"GENIEX_MAX_BODY": "8", "GENIEX_CACHE_RAM_MB": "1"}) == []
    renamed = [a.option_strings for a in cli.serve_flags(p) if len(a.option_strings) > 1]
    assert len(renamed) == 9 and all(new.endswith(("-s", "-ms", "-mb")) for new, _ in renamed), "each names its unit"


def test_every_setting_is_one_declaration() -> None:
    """The parser's flags are the Settings fields that carry a Flag: a field without one is only `port`
    (read from --host); each flag's unit, where it has one, is in its name."""
    from gateway.ops.settings import Settings, declared

    names = [s.name for s in declared()]
    assert set(Settings.__struct_fields__) - set(names) == {"port"}
    p = cli.serve_parser()
    assert [a.dest for a in cli.serve_flags(p)] == names
    args = p.parse_args(["--host", "[::1]:9", "--api-key", "k1", "--api-key", "k2", "--origins", "a, b",
                         "--no-webui", "--keep-alive-s", "-1", "--qnn-simulator"])  # fmt: skip
    s = cli.settings_from(args)
    assert (s.host, s.port, s.api_keys, s.origins, s.webui, s.keep_alive_s) == (
        "::1",
        9,
        ["k1", "k2"],
        ["a", "b"],
        False,
        -1,
    )
    assert s.qnn_simulator and s.data_dir == Settings().data_dir  # an unset path takes the struct's default


def test_a_value_out_of_its_declared_bounds_is_named() -> None:
    from gateway.ops.settings import out_of_bounds

    args = cli.serve_parser().parse_args(["--worker-nice", "25", "--max-connections", "0", "--nctx", "512"])
    assert out_of_bounds(cli.settings_from(args)) == [
        "--worker-nice must be 0..19, not 25",
        "--max-connections must be 1 or more, not 0",
    ]


def test_every_commands_help_prints(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse formats each help with %: a stray one in a flag's text crashes `--help` alone."""
    for command in ("serve", "doctor", "pull", "npu", "usage"):
        with pytest.raises(SystemExit) as done:
            cli.main([command, "--help"])
        assert done.value.code == 0, command
        assert "usage: geniex" in capsys.readouterr().out
