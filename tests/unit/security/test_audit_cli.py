import json

from apps.cli.main import main
from libs.security.audit import AuditEvent, AuditLog


def _write_log(state_dir, name: str, count: int):
    log = AuditLog(state_dir / "audit" / f"{name}.jsonl")
    for i in range(count):
        log.append(AuditEvent(time=f"2026-06-01T00:00:{i:02d}Z", caller="operator/admin",
                              rpc="/fornax.orchestrator.v1.OrchestratorService/DrainPlan",
                              args_sha256="cd" * 32, result="OK", service="orchestrator"))
    return log.path


def test_verify_names_the_edited_entry_and_fails(tmp_path, capsys):
    good = _write_log(tmp_path, "planner", 2)
    edited = _write_log(tmp_path, "orchestrator", 3)
    lines = edited.read_text().splitlines()
    lines[2] = lines[2].replace('"result":"OK"', '"result":"PERMISSION_DENIED:ROLE_NOT_ALLOWED"')
    edited.write_text("\n".join(lines) + "\n")
    assert main(["audit", "verify", "--state-dir", str(tmp_path), "--json"]) == 1
    reports = {r["file"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert reports[str(good)]["ok"] is True
    assert (reports[str(edited)]["problem"], reports[str(edited)]["line"]) == ("HASH_MISMATCH", 3)


def test_show_prints_every_entry(tmp_path, capsys):
    _write_log(tmp_path, "orchestrator", 2)
    assert main(["audit", "show", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all("DrainPlan" in line and "operator/admin" in line for line in out)


def test_no_logs_is_an_error(tmp_path, capsys):
    assert main(["audit", "verify", "--state-dir", str(tmp_path)]) == 2
    assert "no audit logs" in capsys.readouterr().err
