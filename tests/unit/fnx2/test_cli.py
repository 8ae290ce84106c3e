import argparse
import json
from pathlib import Path

from apps.fnx2.cli import _golden, register

GOLDEN = Path(__file__).with_name("fnx2_golden_v2.json")


def run_golden(path) -> int:
    return _golden(argparse.Namespace(path=str(path)))


def test_golden_command_passes_on_the_fixture(capsys):
    assert run_golden(GOLDEN) == 0
    assert "1f4ba161723e850234198404deaae18aa0976ff321e8ce9d312ecf7cf816bb6b" in capsys.readouterr().out


def test_golden_command_fails_on_any_mismatch(tmp_path, capsys):
    fixture = json.loads(GOLDEN.read_text())
    fixture["prefill"]["wire_sequence_no"] = 8
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(fixture))
    assert run_golden(changed) == 1
    fixture["prefill"]["wire_sequence_no"] = 7
    fixture["requests"][0]["execution_lease_id"] = "00000000-0000-4000-8000-000000000000"
    changed.write_text(json.dumps(fixture))
    assert run_golden(changed) == 1
    assert run_golden(tmp_path / "missing.json") == 1


def test_commands_register():
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command")
    benches = commands.add_parser("bench").add_subparsers(dest="bench")
    register(commands, benches)
    args = parser.parse_args(["bench", "fnx2", "--json"])
    assert args.json and callable(args.func)


def test_fuzz_command_registers_and_refuses_bad_arguments(capsys):
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command")
    benches = commands.add_parser("bench").add_subparsers(dest="bench")
    register(commands, benches)
    args = parser.parse_args(["fuzz", "fnx2", "--frames", "0", "--json"])
    assert args.frames == 0 and args.json
    assert args.func(args) == 2 and "--frames" in capsys.readouterr().out
