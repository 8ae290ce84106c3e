"""Building the Mojo kernel package: keyed by its sources, refused when not whole, and a
missing or failing `mojo` is an error (no graph compiles; the builds that run are tiny)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from libs.model.custom_kernels import (
    CUSTOM_OP_FORMATS,
    SOURCES,
    check_package,
    find_mojo,
    gguf_matmul_package,
    op_name,
    package_path,
    sources_sha256,
)
from libs.model.errors import MojoKernelsError


def _tiny_sources(root: Path, body: str = "def answer() -> Int:\n    return 42\n") -> Path:
    src = root / "tiny_kernels"
    src.mkdir()
    (src / "__init__.mojo").write_text("")
    (src / "tiny.mojo").write_text(body)
    return src


def _have_mojo() -> bool:
    try:
        find_mojo()
    except MojoKernelsError:
        return False
    return True


needs_mojo = pytest.mark.skipif(not _have_mojo(), reason="mojo is not installed")


def test_sources_hash_follows_source_bytes_and_build(tmp_path):
    src = _tiny_sources(tmp_path)
    first = sources_sha256(src, "max 26.7.0")
    assert sources_sha256(src, "max 26.8.0") != first
    (src / "tiny.mojo").write_text("def answer() -> Int:\n    return 43\n")
    assert sources_sha256(src, "max 26.7.0") != first
    assert package_path(tmp_path, first) != package_path(tmp_path, sources_sha256(src, "max 26.7.0"))


def test_every_format_has_an_op_and_the_shipped_sources_exist():
    assert [op_name(f) for f in CUSTOM_OP_FORMATS] == [f"fornax_gguf_matmul_{f}" for f in CUSTOM_OP_FORMATS]
    assert sources_sha256(SOURCES)
    with pytest.raises(MojoKernelsError, match="no float32-activation kernel"):
        op_name("q2_k")


def test_missing_mojo_is_an_error(tmp_path):
    with pytest.raises(MojoKernelsError, match="could not run"):
        gguf_matmul_package(tmp_path, "max test", mojo=tmp_path / "no-such-mojo", sources=_tiny_sources(tmp_path))


@needs_mojo
def test_a_failing_build_is_an_error_and_leaves_nothing(tmp_path):
    src = _tiny_sources(tmp_path, "def broken( -> Int:\n")
    with pytest.raises(MojoKernelsError, match="precompile .* failed"):
        gguf_matmul_package(tmp_path / "cache", "max test", sources=src)
    assert not package_path(tmp_path / "cache", sources_sha256(src, "max test")).parent.exists()


@needs_mojo
def test_built_once_then_reused_and_a_corrupted_or_missing_package_is_refused(tmp_path):
    src = _tiny_sources(tmp_path)
    cache = tmp_path / "cache"
    built = gguf_matmul_package(cache, "max test", sources=src)
    stamp = built.stat().st_mtime_ns
    assert gguf_matmul_package(cache, "max test", sources=src) == built
    assert built.stat().st_mtime_ns == stamp  # not rebuilt
    data = bytearray(built.read_bytes())
    data[len(data) // 2] ^= 0xFF
    built.write_bytes(bytes(data))
    with pytest.raises(MojoKernelsError, match="does not match its digest"):
        gguf_matmul_package(cache, "max test", sources=src)
    os.remove(built)
    with pytest.raises(MojoKernelsError, match="is missing"):
        check_package(built)
