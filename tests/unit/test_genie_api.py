"""workers/engines/genie_api.py against the real libGenie the onnxruntime-qnn wheel ships (on this
x86_64 machine, without an NPU): the library loads, names its API version, has every function the
binding declares, and answers a bad dialog or sampler config with its error status, raised as one
clear GenieError. Making a dialog from a bundle with dummy context binaries, which needs the NPU
(or the simulator) to go further, fails with Genie's status, never a crash: that runs in a
subprocess, so a crash would fail the test instead of ending the run."""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.genie_bundles import write_bundle
from workers.engines import genie_api

pytestmark = pytest.mark.skipif(importlib.util.find_spec("onnxruntime_qnn") is None,
                                reason="libGenie ships in onnxruntime-qnn")  # fmt: skip


@pytest.fixture(scope="module")
def genie() -> genie_api.Genie:
    return genie_api.Genie()


def test_the_shipped_library_loads_and_names_its_api_version(genie: genie_api.Genie) -> None:
    assert genie.path == genie_api.library_dir() / "libGenie.so" and genie.path.is_file()
    major, minor, patch = genie.version()
    assert major >= 1 and minor >= 0 and patch >= 0


def test_every_function_the_binding_calls_is_exported(genie: genie_api.Genie) -> None:
    """Checked by name against the library's dynamic symbols (what `nm -D --defined-only` lists)."""
    for name in (*genie_api._CALLS, *genie_api._OPTIONAL):
        assert hasattr(genie.lib, name), name
    assert genie.can_abort and genie.can_sample  # this wheel's Genie has GenieDialog_signal and the sampler API


def test_a_dialog_config_that_is_not_json_is_genies_json_format_error(genie: genie_api.Genie) -> None:
    with pytest.raises(genie_api.GenieError) as exc:
        genie.dialog_config(b"{not json")
    assert (exc.value.call, exc.value.status) == ("GenieDialogConfig_createFromJson", -7)
    assert str(exc.value) == "GenieDialogConfig_createFromJson failed: GENIE_STATUS_ERROR_JSON_FORMAT (-7)"


def test_a_config_genies_schema_refuses_is_its_schema_error(genie: genie_api.Genie) -> None:
    with pytest.raises(genie_api.GenieError, match=r"GENIE_STATUS_ERROR_JSON_SCHEMA \(-8\)"):
        genie.dialog_config(json.dumps({"dialog": {"version": 1}}).encode())


def test_a_well_formed_config_makes_a_handle_that_frees(genie: genie_api.Genie, tmp_path: Path) -> None:
    from protocol.genie_bundle import loadable_config

    handle = genie.dialog_config(loadable_config(write_bundle(tmp_path / "b")))
    assert isinstance(handle, ctypes.c_void_p) and handle.value
    assert genie.call("GenieDialogConfig_free", handle) == 0


@pytest.mark.parametrize(
    "settings",
    [genie_api.sampler_settings(0.8, 40, 0.95, 42),
     genie_api.sampler_settings(0.0, 40, 0.95, 7),  # greedy
     genie_api.sampler_settings(1.3, 0, 1.0, 2**63, n_vocab=32000),  # no top-k limit; a seed beyond int32
     genie_api.sampler_settings(0.7, 0, 0.5, 1)],
)  # fmt: skip
def test_the_sampler_settings_a_request_makes_are_what_genies_schema_takes(genie: genie_api.Genie,
                                                                            settings: dict[str, object]) -> None:  # fmt: skip
    genie.check_sampler(settings)


def test_a_sampler_setting_genie_does_not_know_is_refused(genie: genie_api.Genie) -> None:
    with pytest.raises(genie_api.GenieError, match=r"GenieSamplerConfig_createFromJson failed: .*JSON_SCHEMA"):
        genie.check_sampler({"min-p": 0.05})


def test_the_sampler_settings_map_a_request() -> None:
    assert genie_api.sampler_settings(0.0, 40, 0.9, 5) == {"seed": 5, "top-p": 0.9, "greedy": True, "temp": 1.0,
                                                           "top-k": 40}  # fmt: skip
    assert genie_api.sampler_settings(0.5, 0, 2.0, -1) == {"seed": 2**31 - 1, "top-p": 1.0, "greedy": False,
                                                           "temp": 0.5}  # fmt: skip


DIALOG_SCRIPT = """
import json, os, sys
from pathlib import Path
from protocol.genie_bundle import loadable_config
from protocol.worker_args import WorkerArgs
from workers.engines import genie_api
from workers.engines.qairt import QairtEngine

folder = Path(sys.argv[1])
try:
    genie_api.open_dialog(loadable_config(folder))
    result = {"made": True}
except genie_api.GenieError as exc:
    result = {"call": exc.call, "status": exc.status, "message": str(exc)}
os.environ["GENIEX_QNN_SIMULATOR"] = "1"  # past the host rule, to Genie itself
engine = QairtEngine(WorkerArgs(engine="qairt", model_path=str(folder)))
result["fallback"] = engine.ready().fallback
engine.close()
print("RESULT " + json.dumps(result))
"""


def test_a_dialog_on_dummy_binaries_fails_with_genies_status_not_a_crash(tmp_path: Path) -> None:
    folder = write_bundle(tmp_path / "b")
    env = {k: v for k, v in os.environ.items() if k != "GENIEX_QNN_SIMULATOR"}
    done = subprocess.run([sys.executable, "-c", DIALOG_SCRIPT, str(folder)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert (result.get("call"), result.get("status")) == ("GenieDialog_create", -1), result
    assert result["message"] == "GenieDialog_create failed: GENIE_STATUS_ERROR_GENERAL (-1)"
    assert result["fallback"].startswith("Genie could not load this bundle (GenieDialog_create failed: ")
