"""`fornax profile`'s serving window: how many tokens each stream asks for, and the flags' bounds."""

from __future__ import annotations

import argparse

import pytest

from apps.cli import profile


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    profile.register(commands, argparse.ArgumentParser().add_subparsers())
    return parser.parse_args(["profile", "--fleet", "fleet.yaml", "--checkpoint", "ckpt", *extra])


def test_a_window_asks_for_more_tokens_per_stream_than_a_gate():
    from apps.qualify.run import QualifyConfig

    cfg = profile.window_config(_args(), "ckpt")
    assert cfg.serving_window
    assert cfg.decode_tokens == profile.WINDOW_DECODE_TOKENS > QualifyConfig.decode_tokens
    assert profile.window_config(_args("--window-decode-tokens", "40", "--window-runs", "5"), "ckpt").decode_tokens \
        == 40


@pytest.mark.parametrize(("flags", "named"), [(("--window-runs", "0"), "--window-runs"),
                                              (("--window-decode-tokens", "1"), "--window-decode-tokens")])
def test_a_flag_out_of_range_is_refused_by_name(flags, named):
    with pytest.raises(ValueError, match=named):
        profile.window_config(_args(*flags), "ckpt")
