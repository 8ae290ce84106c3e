import json

import pytest

from libs.security.audit import AuditEvent, AuditLog, AuditProblem, verify_file


def _event(i: int) -> AuditEvent:
    return AuditEvent(time=f"2026-06-01T00:00:0{i}Z", caller="operator/admin",
                      rpc="/fornax.stage_worker.v1.StageWorkerService/UnloadStage",
                      args_sha256="ab" * 32, result="OK", service="stage_worker")


def _log_with(tmp_path, count: int) -> AuditLog:
    log = AuditLog(tmp_path / "audit.jsonl")
    for i in range(count):
        log.append(_event(i))
    return log


def test_untouched_log_verifies(tmp_path):
    log = _log_with(tmp_path, 4)
    result = verify_file(log.path)
    assert result.ok and result.entries == 4 and result.head == log.entries()[-1].hash


def test_edited_entry_is_detected(tmp_path):
    log = _log_with(tmp_path, 3)
    lines = log.path.read_text().splitlines()
    body = json.loads(lines[1])
    body["caller"] = "operator/someone-else"
    lines[1] = json.dumps(body)
    log.path.write_text("\n".join(lines) + "\n")
    result = verify_file(log.path)
    assert result.problem is AuditProblem.HASH_MISMATCH and result.line == 2


def test_removed_entry_is_detected(tmp_path):
    log = _log_with(tmp_path, 3)
    lines = log.path.read_text().splitlines()
    log.path.write_text("\n".join([lines[0], lines[2]]) + "\n")
    result = verify_file(log.path)
    assert result.problem is AuditProblem.SEQUENCE_GAP and result.line == 2


def test_a_tampered_log_is_never_extended(tmp_path):
    log = _log_with(tmp_path, 2)
    log.path.write_text(log.path.read_text().replace("UnloadStage", "LoadStage", 1))
    with pytest.raises(ValueError, match="HASH_MISMATCH"):
        AuditLog(log.path)


def test_reopened_log_continues_the_chain(tmp_path):
    _log_with(tmp_path, 2)
    AuditLog(tmp_path / "audit.jsonl").append(_event(9))
    assert verify_file(tmp_path / "audit.jsonl").entries == 3


def test_one_log_per_path_per_process(tmp_path):
    from libs.security.audit import open_audit_log

    first, second = open_audit_log(tmp_path / "a.jsonl"), open_audit_log(tmp_path / "." / "a.jsonl")
    assert first is second
    first.append(_event(1))
    second.append(_event(2))
    assert verify_file(tmp_path / "a.jsonl").entries == 2
