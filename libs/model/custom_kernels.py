"""The Mojo custom-op package behind block-format linear products in MAX graphs.

`gguf_matmul_mojo/` holds Mojo custom ops `fornax_gguf_matmul_<format>` computing
`y[M, N] = x[M, K] @ W^T` with float32 activations, W bound as its GGUF block bytes (uint8
[N, row bytes]): each weight block is decoded to float32 and multiplied in float32, so nothing
is rounded below float32 (MAX's `ops.qmatmul` quantizes the activations to int8 per 32-block).

`gguf_matmul_package` builds the package once per (sources, MAX build) with the environment's
`mojo` into the compile-cache dir, under a name carrying the sources' hash, and returns its
path for `Graph(..., custom_extensions=[path])`. Builds write to a scratch name and rename
atomically, so two processes building at once both end with a whole package; a sidecar digest
is checked on every use, so a truncated or altered package is refused. A missing `mojo` or a
failed build is an error (`MOJO_KERNELS`), never a silent fallback. Nothing here imports `max`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from libs.model.errors import MojoKernelsError
from libs.weights.policy import MAX_QMATMUL_FORMATS

SOURCES = Path(__file__).parent / "gguf_matmul_mojo"
PACKAGE_DIR = "fornax-kernels"
PACKAGE_STEM = "gguf_matmul"
# Block formats the package runs, in GGUF's layouts; the op for one is `op_name(fmt)`.
CUSTOM_OP_FORMATS = ("q8_0", "q4_k", "q6_k", "q4_0", "q5_0", "q5_1")
BUILD_TIMEOUT_S = 600


def needs_custom_op(fmt: str, activations: str) -> bool:
    """Whether a block format's products run this package's op under a stage's activations
    ("int8": only formats `ops.qmatmul` lacks; "float32": every block format)."""
    return activations == "float32" or fmt not in MAX_QMATMUL_FORMATS


def op_name(fmt: str) -> str:
    if fmt not in CUSTOM_OP_FORMATS:
        raise MojoKernelsError(f"no float32-activation kernel for {fmt!r}; have {', '.join(CUSTOM_OP_FORMATS)}")
    return f"fornax_gguf_matmul_{fmt}"


def sources_sha256(sources: Path = SOURCES, build: str = "") -> str:
    """Hash of every Mojo source file (names and bytes) and the MAX build they are built for."""
    digest = hashlib.sha256(build.encode())
    files = sorted(sources.glob("*.mojo"))
    if not files:
        raise MojoKernelsError(f"no Mojo kernel sources in {sources}")
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def find_mojo() -> Path:
    """The `mojo` beside this interpreter (the venv MAX is installed in), else on PATH."""
    beside = Path(sys.executable).parent / "mojo"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mojo")
    if found is None:
        raise MojoKernelsError(
            f"`mojo` is not installed (looked beside {sys.executable} and on PATH); it builds the "
            "float32-activation kernels for block-format weights (install the `mojo` package in this venv)")
    return Path(found)


def package_path(cache_dir: Path, sources_hash: str) -> Path:
    return cache_dir / PACKAGE_DIR / f"{PACKAGE_STEM}-{sources_hash[:24]}" / f"{PACKAGE_STEM}.mojoc"


def _digest_path(package: Path) -> Path:
    return package.with_suffix(".sha256")


def check_package(package: Path) -> Path:
    """`package` if it is whole (its bytes match the digest written when it was built)."""
    digest = _digest_path(package)
    if not package.is_file() or not digest.is_file():
        raise MojoKernelsError(f"kernel package {package} is missing (or its digest {digest.name} is)")
    actual = hashlib.sha256(package.read_bytes()).hexdigest()
    if actual != digest.read_text(encoding="utf-8").strip():
        raise MojoKernelsError(f"kernel package {package} does not match its digest; delete its folder to rebuild")
    return package


def gguf_matmul_package(cache_dir: Path, build: str, mojo: Path | None = None, sources: Path = SOURCES) -> Path:
    """The built package for `sources` and MAX `build` ("max 26.7.0"), built now if absent.

    A build fills a scratch folder (package and digest) and renames the folder into place; when
    another process got there first, its folder stays and this build is dropped."""
    target = package_path(cache_dir, sources_sha256(sources, build))
    if target.parent.is_dir():
        return check_package(target)
    compiler = mojo or find_mojo()
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=target.parent.parent, prefix=".build-"))
    scratch.chmod(0o755)
    try:
        built = scratch / target.name
        try:
            done = subprocess.run([str(compiler), "precompile", str(sources), "-o", str(built)],
                                  capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MojoKernelsError(f"could not run {compiler} precompile: {exc}") from exc
        if done.returncode != 0 or not built.is_file():
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-20:])
            raise MojoKernelsError(f"{compiler} precompile {sources} failed (exit {done.returncode}):\n{tail}")
        _digest_path(built).write_text(hashlib.sha256(built.read_bytes()).hexdigest() + "\n", encoding="utf-8")
        try:
            scratch.rename(target.parent)
        except OSError:
            if not target.parent.is_dir():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return check_package(target)
