"""Size limits of the project's own modules (libs, services, apps; not the generated libs/api):
at most 600 lines a file and 50 lines a function or method, counted from its `def` to its
last line. Ruff's C90 (max-complexity 10, pyproject) bounds the branches; this bounds the
length. Pure: the sources are parsed, never imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("libs", "services", "apps")
GENERATED = (Path("libs", "api"),)  # checked in, written by scripts/gen_proto.sh
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 50


def project_modules(root: Path = ROOT) -> list[Path]:
    return sorted(path for package in PACKAGES for path in (root / package).rglob("*.py")
                  if not any(path.is_relative_to(root / generated) for generated in GENERATED))


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[int, str, int]]:
    """(line of `def`, name, lines) for each function or method longer than `limit`; a nested
    function counts on its own and within the function that holds it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > limit:
                found.append((node.lineno, node.name, length))
    return sorted(found)


def size_offenders(root: Path = ROOT) -> list[str]:
    """`path:line name: N lines (limit L)` for every file and function over its limit."""
    offenders = []
    for path in project_modules(root):
        source = path.read_text(encoding="utf-8")
        shown = path.relative_to(root)
        lines = len(source.splitlines())
        if lines > MAX_FILE_LINES:
            offenders.append(f"{shown}:1 (file): {lines} lines (limit {MAX_FILE_LINES})")
        offenders += [f"{shown}:{line} {name}: {length} lines (limit {MAX_FUNCTION_LINES})"
                      for line, name, length in long_functions(source)]
    return offenders


def test_no_project_module_or_function_exceeds_its_size_limit():
    offenders = size_offenders()
    assert not offenders, "split these into smaller, well-named pieces:\n" + "\n".join(offenders)


def test_the_project_modules_are_found_and_the_generated_api_is_not():
    modules = project_modules()
    assert ROOT / "libs" / "fnx2" / "wire" / "codec.py" in modules
    assert ROOT / "apps" / "cli" / "main.py" in modules
    assert not any(path.is_relative_to(ROOT / "libs" / "api") for path in modules)


def test_a_function_is_measured_from_def_to_its_last_line_methods_and_nested_ones_too():
    body = "".join(f"    x{i} = {i}\n" for i in range(49))  # def + 49 lines = 50: at the limit
    at_limit = f"def fits():\n{body}"
    assert long_functions(at_limit) == []
    over = f"@decorated\ndef too_long():\n{body}    return x0\n"
    assert long_functions(over) == [(2, "too_long", 51)]
    nested = "class C:\n    async def method(self):\n        def inner():\n" + "".join(
        f"            y{i} = {i}\n" for i in range(50))
    assert long_functions(nested) == [(2, "method", 52), (3, "inner", 51)]


def test_an_oversized_file_and_function_are_reported_with_path_line_and_length(tmp_path):
    module = tmp_path / "services" / "big.py"
    module.parent.mkdir()
    module.write_text("\n" * 590 + "def f():\n" + "    pass\n" * 55, encoding="utf-8")
    (tmp_path / "libs" / "api").mkdir(parents=True)
    (tmp_path / "libs" / "api" / "gen_pb2.py").write_text("x = 1\n" * 700, encoding="utf-8")
    (tmp_path / "apps").mkdir()
    shown = Path("services", "big.py")
    assert size_offenders(tmp_path) == [
        f"{shown}:1 (file): 646 lines (limit 600)", f"{shown}:591 f: 56 lines (limit 50)"]
