"""The orchestrator's subpackages import one way: api/ and route/ drive engine/, the shell wires them.

engine/ imports neither api/, route/ nor the shell (server, config, convert, ...); no import cycle
runs between the subpackages and the shell, nor between any two orchestrator modules. Ruff's
banned-API check (`services/orchestrator/*/ruff.toml`) sees import statements; these tests also
see imports under `if TYPE_CHECKING:` and module paths named in strings. Pure: the sources are
parsed, never imported.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.tooling.test_layering import ROOT, referenced_modules

PACKAGE = "services.orchestrator"
SUBPACKAGES = ("api", "engine", "route")


def orchestrator_modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the orchestrator package."""
    folder = ROOT / "services" / "orchestrator"
    modules = {}
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def part_of(module: str) -> str | None:
    """api, engine or route for a module in a subpackage, shell for the rest of the package."""
    if module != PACKAGE and not module.startswith(PACKAGE + "."):
        return None
    head = module.removeprefix(PACKAGE).lstrip(".").split(".")[0]
    return head if head in SUBPACKAGES else "shell"


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest known module a referenced name lies in (`a.b.Class` -> `a.b`)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def module_graph() -> dict[str, set[str]]:
    """Module -> the orchestrator modules it references (the package itself left out)."""
    modules = orchestrator_modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        targets = {_resolve(name, modules) for _, name in referenced_modules(path.read_text(), package)}
        graph[module] = {t for t in targets if t is not None and t != module and t != PACKAGE}
    return graph


def part_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    parts: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = part_of(module)
        assert source is not None
        parts.setdefault(source, set()).update(
            target for t in targets if (target := part_of(t)) is not None and target != source)
    return parts


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of `graph` as [a, b, ..., a], or [] when it has none."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str]:
        path.append(node)
        on_path.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_path:
                return path[path.index(nxt):] + [nxt]
            if nxt not in done:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        on_path.discard(node)
        done.add(node)
        return []

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle:
                return cycle
    return []


def test_the_engine_imports_neither_the_front_ends_nor_the_route_machinery_nor_the_shell():
    graph = module_graph()
    reached = sorted(f"{module} -> {target}" for module, targets in graph.items() if part_of(module) == "engine"
                     for target in targets if part_of(target) != "engine")
    assert reached == []


def test_api_and_route_never_import_each_other():
    parts = part_graph(module_graph())
    assert "route" not in parts.get("api", set())
    assert "api" not in parts.get("route", set())


def test_no_import_cycle_between_the_subpackages_and_the_shell():
    assert find_cycle(part_graph(module_graph())) == []


def test_no_import_cycle_between_orchestrator_modules():
    assert find_cycle(module_graph()) == []


def test_the_checks_see_every_subpackage_and_would_see_a_cycle():
    graph = module_graph()
    assert {part_of(m) for m in graph} == {"api", "engine", "route", "shell"}
    assert f"{PACKAGE}.engine.domain" in graph[f"{PACKAGE}.engine.serving"]
    assert part_of("services.planner.model") is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []
