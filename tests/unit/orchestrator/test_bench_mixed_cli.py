"""`fornax bench serve --mixed`: its arguments and the scheduler settings it compares."""

from __future__ import annotations

import argparse

from apps.bench import cli
from apps.bench.cli import register
from apps.bench.mixed import MixedOptions, scheduler_configs


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command")
    benches = commands.add_parser("bench").add_subparsers(dest="bench")
    register(commands, benches)
    return parser.parse_args(["bench", "serve", *argv])


def test_mixed_refuses_a_step_budget_below_one(capsys, monkeypatch):
    # The command points structlog at the (captured) stderr; keep it off the global config.
    monkeypatch.setattr(cli, "_quiet_logs", lambda: None)
    args = parse("--mixed", "--tokens-per-step", "0", "--checkpoint", "unused")
    assert args.mixed and args.func(args) == 2
    assert "--tokens-per-step" in capsys.readouterr().err


def test_the_two_settings_differ_only_in_the_step_budget():
    configs = scheduler_configs(MixedOptions("unused", tokens_per_step=40, min_prefill_chunk_tokens=8))
    chunked, unchunked = configs["chunked"], configs["unchunked"]
    assert (chunked.max_tokens_per_step, chunked.min_prefill_chunk_tokens) == (40, 8)
    assert unchunked.max_tokens_per_step == 0
    assert chunked.inflight_microbatches == unchunked.inflight_microbatches == 2
    assert chunked.max_prefill_rows_per_microbatch == unchunked.max_prefill_rows_per_microbatch
