"""Reach a local mTLS fleet the way the command line does: with its operator certificate."""

from __future__ import annotations

from pathlib import Path

import grpc

from libs.security.cli_credentials import operator_credentials


def operator_channel(state_dir: str | Path, address: str) -> grpc.Channel:
    credentials = operator_credentials(state_dir, env={})
    assert credentials is not None, f"no operator certificate under {state_dir}"
    return grpc.secure_channel(address, credentials.channel_credentials())
