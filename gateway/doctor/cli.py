"""`geniex doctor [--json] [--compute cpu,gpu,npu] [--require UNITS] [--unit [SERVICE]]`."""

from __future__ import annotations

import argparse
import sys

import msgspec

from gateway.doctor.report import PROBE_TIMEOUT_S, QNN_TIMEOUT_S, examine, render
from gateway.doctor.sandbox import SandboxError, check_can_enter, run_in_sandbox
from protocol.doctor import UNITS, Report

SERVICE = "geniex.service"


def _units(value: str) -> set[str]:
    chosen = {u.strip() for u in value.split(",") if u.strip()}
    if not chosen or chosen - set(UNITS):
        raise argparse.ArgumentTypeError(f"a comma-separated list of {', '.join(UNITS)}")
    return chosen


def _seconds(value: str) -> float:
    try:
        s = float(value)
    except ValueError:
        s = float("nan")
    if not 1 <= s <= 3600:  # nan fails too
        raise argparse.ArgumentTypeError("seconds from 1 to 3600")
    return s


def add_doctor_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("doctor", help="whether this server can use each compute unit (CPU, GPU, NPU), and if not why")
    p.add_argument("--json", action="store_true", help="print the report as JSON (for tools)")
    p.add_argument("--compute", type=_units, default=set(UNITS), metavar="UNITS",
                   help="check only these units (default: cpu,gpu,npu)")  # fmt: skip
    p.add_argument("--require", type=_units, default=set(), metavar="UNITS",
                   help="exit 1 unless each of these units is usable (e.g. --require npu)")  # fmt: skip
    p.add_argument("--unit", nargs="?", const=SERVICE, metavar="SERVICE",
                   help=f"also run the checks inside the systemd unit's sandbox (default {SERVICE}; needs root)")  # fmt: skip
    p.add_argument("--timeout", type=_seconds, default=PROBE_TIMEOUT_S, metavar="S",
                   help=f"seconds before an engine probe is called hung (default {PROBE_TIMEOUT_S:g}; "
                   f"the NPU's {QNN_TIMEOUT_S:g})")  # fmt: skip
    p.add_argument("--in-sandbox", default="", help=argparse.SUPPRESS)  # set by --unit for the inner run
    p.set_defaults(func=_doctor)


def _doctor(args: argparse.Namespace) -> int:
    if args.unit:
        try:
            check_can_enter()  # before minutes of probes, not after
        except SandboxError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    report = examine(args.compute, timeout_s=args.timeout, qnn_timeout_s=min(args.timeout, QNN_TIMEOUT_S))
    report.sandbox = args.in_sandbox
    inside: Report | None = None
    if args.unit:
        try:
            inner = ["--compute", ",".join(sorted(args.compute)), "--timeout", f"{args.timeout:g}"]
            inside = msgspec.json.decode(run_in_sandbox(args.unit, sys.executable, inner, 4 * args.timeout + 60),
                                         type=Report)  # fmt: skip
        except (SandboxError, msgspec.DecodeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.json:
        out = msgspec.json.encode({"outside": report, "inside": inside} if inside else report)
        print(msgspec.json.format(out.decode(), indent=2))
    else:
        print(render(report))
        if inside is not None:
            print("\n" + render(inside) + "\n\n" + differences(report, inside))
    judged = inside or report
    unusable = [v.unit for v in judged.units if v.unit in args.require and not v.usable]
    return 1 if unusable else 0


def differences(outside: Report, inside: Report) -> str:
    """What the sandbox takes away (or gives): the checks whose status differs."""
    before = {c.name: c for c in outside.checks}
    changed = [f"  {c.name}: {before[c.name].status} outside, {c.status} inside: {c.detail}"
               for c in inside.checks if c.name in before and before[c.name].status != c.status]  # fmt: skip
    if not changed:
        return f"Inside {inside.sandbox}'s sandbox every check came out as it did outside."
    return f"What {inside.sandbox}'s sandbox changes:\n" + "\n".join(changed)
