"""Where MAX caches compiled graphs is decided by the process entry point, never by the library."""

from __future__ import annotations

import ast
from pathlib import Path

from libs.model import max_kernels
from libs.model.max_kernels import CACHE_DIR_ENV, configure_max_process, default_cache_dir

REPO = Path(__file__).resolve().parents[3]
MUTATORS = ("setdefault", "update", "pop", "clear", "__setitem__")


def test_the_cache_dir_comes_from_one_variable_else_the_home_default():
    assert default_cache_dir({CACHE_DIR_ENV: "/srv/cache"}) == Path("/srv/cache")
    assert default_cache_dir({}) == default_cache_dir() == Path.home() / ".cache" / "fornax" / "max"
    assert CACHE_DIR_ENV == "FORNAX_COMPILE_CACHE_DIR"


def test_an_entry_point_gets_the_cache_dir_and_telemetry_off_unless_turned_on(tmp_path):
    env = {"MODULAR_TELEMETRY_ENABLED": "1"}
    configure_max_process(env, tmp_path / "graphs")
    assert env == {"MODULAR_MAX_CACHE_DIR": str(tmp_path / "graphs"), "MODULAR_TELEMETRY_ENABLED": "1"}
    assert (tmp_path / "graphs").is_dir()
    quiet: dict[str, str] = {}
    configure_max_process(quiet, tmp_path / "graphs")
    assert quiet["MODULAR_TELEMETRY_ENABLED"] == "0"


def _environment_writes(source: str) -> list[int]:
    """Lines that assign into, or call a mutating method of, something named `environ`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            targets = [t.value for t in node.targets if isinstance(t, ast.Subscript)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            targets = [node.func.value]
        else:
            continue
        lines += [node.lineno for t in targets if isinstance(t, ast.Attribute) and t.attr == "environ"]
    return lines


def test_the_environment_check_sees_a_write():
    assert _environment_writes("import os\nos.environ['A'] = '1'\nos.environ.setdefault('B', '0')\n") == [2, 3]


def test_no_library_module_writes_the_process_environment():
    libraries = [p for p in sorted((REPO / "libs").rglob("*.py")) if not p.is_relative_to(REPO / "libs" / "api")]
    writers = {str(p.relative_to(REPO)): _environment_writes(p.read_text(encoding="utf-8")) for p in libraries}
    assert {path: lines for path, lines in writers.items() if lines} == {}
    assert "os.environ" not in Path(max_kernels.__file__).read_text(encoding="utf-8")
