"""The `fornax` command line: one dispatcher, commands registered by their own modules.

Each module named in COMMAND_MODULES exposes `register(commands, benches)`, where
`commands` is the top-level argparse subparsers object and `benches` is the one under
`fornax bench`. A registered parser sets `func=callable(args) -> int` via set_defaults.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES: tuple[str, ...] = (
    "apps.cli.fleet",
    "apps.cli.host",
    "apps.cli.plan",
    "apps.cli.profile",
    "apps.cli.security",
    "apps.bench.cli",
    "apps.qualify.cli",
    "apps.fnx2.cli",
    "apps.cli.model",
    "apps.cli.max_backend",
    "apps.cli.artifact_builder",
    "apps.cli.evidence_registry",
    "apps.cli.orchestrator",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fornax", description="Fornax fleet command line")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    bench = commands.add_parser("bench", help="side-by-side benchmarks (figures for this host)")
    benches = bench.add_subparsers(dest="bench", metavar="TARGET", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(commands, benches)
    from apps.bench.record_cli import add_record_arguments

    add_record_arguments(benches)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "record", False):
        from apps.bench.record_cli import run_recorded

        return run_recorded(args, sys.argv[1:] if argv is None else argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
