"""The background keeper re-runs `fornax up` with every option the operator gave."""

from pathlib import Path

from apps.cli.fleet import _up_argv
from apps.cli.main import build_parser


def test_the_keeper_gets_every_up_option_back(tmp_path):
    (tmp_path / "ckpt").mkdir()
    given = ["up", "--state-dir", str(tmp_path / "s"), "--stages", "3", "--backend", "numpy",
             "--boundary-dtype", "fp32", "--checkpoint", str(tmp_path / "ckpt"), "--http-port", "8123",
             "--read-root", str(tmp_path), "--insecure", "--http-insecure", "--no-serve-while-compiling",
             "--mode", "deployment", "--startup-timeout-s", "77", "--install-timeout-s", "99",
             "--max-switch", "always", "--max-switch-rows", "1,4", "--rejoin-timeout", "3.5"]
    parser = build_parser()
    first = parser.parse_args(given)
    again = parser.parse_args([*_up_argv(first), "--foreground", "--keeper"])
    skip = {"func", "foreground", "keeper"}
    assert {k: v for k, v in vars(again).items() if k not in skip} == \
        {k: v for k, v in vars(first).items() if k not in skip}
    assert again.foreground and again.keeper and Path(again.state_dir).is_absolute()


def test_up_refuses_bad_switch_rows_before_starting_anything(tmp_path):
    from apps.cli.fleet import _options, _validate_up

    parser = build_parser()
    bad = parser.parse_args(["up", "--state-dir", str(tmp_path / "s"), "--max-switch-rows", "0,8"])
    assert _validate_up(bad).startswith("INVALID_MAX_SWITCH_ROWS: --max-switch-rows must be")
    good = parser.parse_args(["up", "--state-dir", str(tmp_path / "s"), "--backend", "max", "--max-switch-rows", "8,1"])
    assert _validate_up(good) is None
    options = _options(good)
    assert (options.max_switch, options.max_switch_rows) == ("measured", "8,1")


def test_up_refuses_a_negative_rejoin_timeout_and_hands_a_given_one_to_the_orchestrator(tmp_path):
    from apps.cli.fleet import _options, _validate_up
    from apps.fleet.compose import orchestrator_options_env

    parser = build_parser()
    bad = parser.parse_args(["up", "--state-dir", str(tmp_path / "s"), "--rejoin-timeout", "-1"])
    assert _validate_up(bad).startswith("--rejoin-timeout takes seconds >= 0")
    default = parser.parse_args(["up", "--state-dir", str(tmp_path / "s")])
    assert _options(default).rejoin_timeout_s == 0.0  # off unless asked for
    given = parser.parse_args(["up", "--state-dir", str(tmp_path / "s"), "--rejoin-timeout", "3"])
    assert _validate_up(given) is None
    assert orchestrator_options_env(_options(given))["FORNAX_REJOIN_TIMEOUT_S"] == "3.0"
