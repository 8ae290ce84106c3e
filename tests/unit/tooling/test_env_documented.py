"""Configuration is a string contract: every FORNAX_* variable that the product's code names
(libs, services, apps) is documented in a README, so no setting exists that only the source
tells of."""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
CODE_DIRS = ("libs", "services", "apps")
GENERATED = REPO_ROOT / "libs" / "api"
DOC_DIRS = ("libs", "services", "apps", "helm")
# A variable is named in code as a whole string literal: os.environ["FORNAX_X"],
# pick(..., env, "FORNAX_X", ...), ENV_X = "FORNAX_X", {"FORNAX_X": ...} for a child.
NAMED_IN_CODE = re.compile(r"""["'](FORNAX_[A-Z0-9_]*[A-Z0-9])["']""")
NAMED_IN_DOCS = re.compile(r"\bFORNAX_[A-Z0-9_]*[A-Z0-9]\b")


def names_in_code() -> dict[str, set[str]]:
    """Each variable the code names, with the files that name it."""
    found: dict[str, set[str]] = {}
    for top in CODE_DIRS:
        for path in (REPO_ROOT / top).rglob("*.py"):
            if GENERATED in path.parents:
                continue
            for name in NAMED_IN_CODE.findall(path.read_text(encoding="utf-8")):
                found.setdefault(name, set()).add(str(path.relative_to(REPO_ROOT)))
    return found


def readmes() -> list[Path]:
    nested = [path for top in DOC_DIRS for path in (REPO_ROOT / top).rglob("README.md")]
    return [REPO_ROOT / "README.md", *nested]


def documented_names() -> set[str]:
    return {name for path in readmes() for name in NAMED_IN_DOCS.findall(path.read_text(encoding="utf-8"))}


def test_the_scan_finds_the_variables_the_services_read():
    names = names_in_code()
    assert {"FORNAX_API_KEY", "FORNAX_TLS_CA", "FORNAX_STAGE_INDEX", "FORNAX_PLAN_MODE"} <= names.keys()
    assert "services/stage_worker/config.py" in names["FORNAX_STAGE_INDEX"]
    assert not any("FORNAX_" in name[len("FORNAX_"):] for name in names)


def test_every_fornax_variable_named_in_code_is_documented_in_a_readme():
    documented = documented_names()
    missing = {name: sorted(files) for name, files in names_in_code().items() if name not in documented}
    assert not missing, "FORNAX_* variables no README documents: " + "; ".join(
        f"{name} ({', '.join(files)})" for name, files in sorted(missing.items()))


def test_every_variable_a_settings_section_reads_is_documented_in_a_readme():
    """Sections read their variables through field metadata, not one string per read: collect
    the names from the sections themselves, so a section whose name is built (or that no
    literal scan sees) is still held to the contract."""
    from services.orchestrator.config import FLAGS, section_variables

    read = set(section_variables())
    assert {"FORNAX_HTTP_PORT", "FORNAX_MAX_LIVE_REQUESTS", "FORNAX_STAGE_WORKERS", "FORNAX_DRIFT_SUSTAIN_ROUNDS",
            "FORNAX_INPROCESS_BACKEND"} <= read
    assert {flag.variable for flag in FLAGS} <= read, "a flag names a variable no section reads"
    missing = sorted(read - documented_names())
    assert not missing, "FORNAX_* variables a settings section reads that no README documents: " + ", ".join(missing)
