"""The `--record` option every `fornax bench` target gets: run the bench, then store its JSON report.

The bench runs unchanged with `--json` forced on; its stdout passes through to the terminal and
is parsed as one JSON report, which `apps.bench.record.record_report` signs and stores. A bench
that prints no JSON report, or a record the registry refuses, exits 2 with a stable reason.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys

from libs.service.errors import FornaxError


class _Tee(io.TextIOBase):
    def __init__(self, *sinks):
        self._sinks = sinks

    def write(self, text: str) -> int:
        for sink in self._sinks:
            sink.write(text)
        return len(text)

    def flush(self) -> None:
        for sink in self._sinks:
            sink.flush()


def add_record_arguments(benches) -> None:
    """--record and its options on every bench target; an option a target already has keeps its own."""
    options = (
        ("--record", {"action": "store_true",
                      "help": "store the JSON report in the evidence registry as a signed physical "
                              "measurement (forces --json)"}),
        ("--sign-as", {"metavar": "ROLE/NAME",
                       "help": "--record: the measuring identity whose certificate under <state dir>/certs "
                               "signs the record (default host/<this host's name>)"}),
        ("--registry", {"help": "--record: registry gRPC address (default: <state dir>/fleet.json)"}),
        ("--state-dir", {"default": ".fornax", "help": "--record: where fleet.json and certs live"}),
    )
    for parser in benches.choices.values():
        for flag, spec in options:
            if flag not in parser._option_string_actions:
                parser.add_argument(flag, **spec)


def run_recorded(args: argparse.Namespace, argv: list[str]) -> int:
    from apps.bench.record import RecordError, record_report

    if hasattr(args, "json"):
        args.json = True
    captured = io.StringIO()
    with contextlib.redirect_stdout(_Tee(sys.stdout, captured)):
        code = int(args.func(args) or 0)
    command = "fornax " + " ".join(argv)
    try:
        report = json.loads(captured.getvalue())
    except json.JSONDecodeError:
        print(f"fornax bench {args.bench} --record: REPORT_NOT_JSON: the bench printed no JSON report",
              file=sys.stderr)
        return 2
    try:
        record = record_report(args, report, command)
    except RecordError as exc:
        print(f"fornax bench {args.bench} --record: {exc.reason}: {exc}", file=sys.stderr)
        return 2
    except FornaxError as exc:
        print(f"fornax bench {args.bench} --record: {exc.reason}: {exc}", file=sys.stderr)
        return 2
    print(f"recorded {record.record_id} (measurement, physical, signed by {record.content.provenance.measured_by}, "
          f"blob {record.blob.digest})", file=sys.stderr)
    return code
