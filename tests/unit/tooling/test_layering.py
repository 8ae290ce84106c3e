"""The layer rules hold for every way a module can reach another one.

Ruff's banned-API check (`libs/ruff.toml`, `libs/fnx2/{wire,channel}/ruff.toml`,
`services/planner/ruff.toml`) sees import statements.
These tests also see module paths named in strings: `importlib.import_module("apps.x")`, a
`"module:attr"` entry point, `[sys.executable, "-m", "apps.x"]`. Pure: the sources are parsed, never
imported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# A dotted module path, optionally followed by ":attribute" (an entry-point string).
_MODULE_PATH = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?::[\w.]+)?$")


def _package_of(path: Path, root: Path = ROOT) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts[:-1])


def referenced_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, module) for every import and every string that spells a dotted module path."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _MODULE_PATH.match(node.value.strip())
            if match:
                found.append((node.lineno, match.group(1)))
    return found


def _is_under(module: str, banned: str) -> bool:
    return module == banned or module.startswith(banned + ".")


def violations(folder: str, banned: tuple[str, ...], skip: tuple[str, ...] = (),
               root: Path = ROOT) -> list[str]:
    out = []
    for path in sorted((root / folder).rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if any(relative.startswith(s) for s in skip):
            continue
        for line, module in referenced_modules(path.read_text(), _package_of(path, root)):
            out += [f"{relative}:{line}: {module}" for b in banned if _is_under(module, b)]
    return out


def test_the_planner_never_reaches_the_orchestrator():
    assert violations("services/planner", ("services.orchestrator",)) == []


def test_libraries_never_reach_applications_or_services():
    assert violations("libs", ("apps", "services"), skip=("libs/api/",)) == []


def test_the_fnx2_wire_format_never_reaches_channels_event_loops_or_sockets():
    assert violations("libs/fnx2/wire", ("libs.fnx2.channel", "asyncio", "socket", "ssl")) == []


def test_fnx2_channels_never_reach_services_or_applications():
    # The stage's lease rules come in as a SessionRules object, never by import.
    assert violations("libs/fnx2/channel", ("services", "apps")) == []


def test_the_fnx2_layer_checks_see_a_violation(tmp_path):
    wire = tmp_path / "libs" / "fnx2" / "wire"
    wire.mkdir(parents=True)
    (wire / "codec.py").write_text("import asyncio\nfrom ..channel import stream\n")
    found = violations("libs/fnx2/wire", ("libs.fnx2.channel", "asyncio"), root=tmp_path)
    assert found == ["libs/fnx2/wire/codec.py:1: asyncio", "libs/fnx2/wire/codec.py:2: libs.fnx2.channel",
                     "libs/fnx2/wire/codec.py:2: libs.fnx2.channel.stream"]


def test_services_never_reach_applications():
    assert violations("services", ("apps",)) == []


def test_each_way_of_naming_a_module_is_seen():
    source = ("import apps.cli.main\nfrom services.orchestrator import engine\nfrom . import sibling\n"
              "import importlib\nimportlib.import_module('apps.fnx2.cli')\n"
              "ENTRY = 'services.orchestrator.server:main'\nARGS = ['-m', 'apps.fnx2.fuzz_receiver']\n"
              "TEXT = 'not a module, apps. and prose'\n")
    found = {module for _, module in referenced_modules(source, "services.planner")}
    assert {"apps.cli.main", "services.orchestrator", "services.orchestrator.engine", "services.planner.sibling",
            "apps.fnx2.cli", "services.orchestrator.server", "apps.fnx2.fuzz_receiver"} <= found
    assert not any(_is_under(m, "apps") for m in found - {"apps.cli.main", "apps.fnx2.cli",
                                                          "apps.fnx2.fuzz_receiver"})
    assert not _is_under("appsx.y", "apps")
