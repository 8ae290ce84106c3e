"""`bench serve --fleet FILE --compare-routes`: the report's arithmetic on recorded numbers, the
layouts it picks from the planner's candidates, and the arguments it refuses."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from apps.bench import cli
from apps.bench import layout_compare as lc
from apps.bench.fleet_layouts import LayoutBenchOptions, check_options
from apps.fleet.spec import load_fleet_spec
from services.planner.domain import LayoutCandidate

FLEETS = Path(__file__).resolve().parents[3] / "fleets"
FOUR_HOSTS, THREE_HOSTS = str(FLEETS / "four-hosts.yaml"), str(FLEETS / "three-hosts.yaml")


def _candidate(hosts: tuple[tuple[str, ...], ...], tok_s: float, feasible: bool = True) -> LayoutCandidate:
    return LayoutCandidate(" | ".join(">".join(g) for g in hosts), len(hosts), hosts, feasible, tok_s)


CANDIDATES = (
    _candidate((("a", "b", "c", "d"),), 100.0),
    _candidate((("a", "b", "c"), ("d",)), 130.0),  # two routes, unequal: never the pair
    _candidate((("a", "b"), ("c", "d")), 120.0),
    _candidate((("a", "c"), ("b", "d")), 125.0),
    _candidate((("a", "d"), ("b", "c")), 140.0, feasible=False),
    _candidate((("a",), ("b",), ("c",), ("d",)), 150.0),
)


def test_the_single_route_spans_every_stage_host():
    pick = lc.pick_single(CANDIDATES, 4)
    assert (pick.name, pick.hosts, pick.predicted_tok_s) == (lc.SINGLE, (("a", "b", "c", "d"),), 100.0)


def test_the_pair_is_the_best_predicted_feasible_layout_of_two_equal_routes():
    pick = lc.pick_equal_pair(CANDIDATES, 4)
    assert (pick.name, pick.hosts, pick.predicted_tok_s) == (lc.REPLICAS, (("a", "c"), ("b", "d")), 125.0)


def test_no_feasible_layout_of_the_shape_is_a_reasoned_refusal():
    with pytest.raises(lc.LayoutPickError) as single:
        lc.pick_single(CANDIDATES[1:], 4)
    assert single.value.reason == "NO_SINGLE_ROUTE"
    with pytest.raises(lc.LayoutPickError) as pair:
        lc.pick_equal_pair((CANDIDATES[0], CANDIDATES[1], CANDIDATES[4]), 4)
    assert pair.value.reason == "NO_EQUAL_ROUTE_PAIR"


def test_the_planner_chooses_the_higher_prediction_and_one_route_on_a_tie():
    single, pair = lc.pick_single(CANDIDATES, 4), lc.pick_equal_pair(CANDIDATES, 4)
    assert lc.planner_choice(single, pair) == lc.REPLICAS
    tied = lc.LayoutPick(lc.REPLICAS, "2 routes", pair.hosts, single.predicted_tok_s)
    assert lc.planner_choice(single, tied) == lc.SINGLE


def test_route_groups_index_the_stage_hosts_and_one_route_needs_none():
    hosts = ["a", "b", "c", "d"]
    assert lc.groups_of(lc.pick_equal_pair(CANDIDATES, 4), hosts) == ((0, 2), (1, 3))
    assert lc.groups_of(lc.pick_single(CANDIDATES, 4), hosts) == ()


def _level(single: float, pair: float, predicted_single: float, predicted_pair: float) -> lc.LevelComparison:
    return lc.LevelComparison({lc.SINGLE: single, lc.REPLICAS: pair},
                              {lc.SINGLE: predicted_single, lc.REPLICAS: predicted_pair})


def test_chosen_vs_best_is_the_chosen_layouts_measured_share_of_the_faster_one():
    # Recorded shape: the pair predicted and chosen; it measured slower at c8, faster at c64.
    report = lc.compare({"c8": _level(50.0, 40.0, 30.0, 35.0), "c64": _level(80.0, 100.0, 60.0, 90.0)},
                        lc.REPLICAS)
    assert report["chosen_vs_best_c8"] == pytest.approx(0.8)
    assert report["chosen_vs_best_c64"] == 1.0
    assert (report["best_measured_c8"], report["best_measured_c64"]) == (lc.SINGLE, lc.REPLICAS)
    assert report["planner_picked_faster_c8"] is False and report["planner_picked_faster_c64"] is True
    assert report["planner_picked_faster"] is False


def test_planner_picked_faster_follows_each_levels_prediction_not_the_chosen_layout():
    # One route predicted faster at c8, the pair at c32: both measured so.
    report = lc.compare({"c8": _level(50.0, 40.0, 45.0, 35.0), "c32": _level(60.0, 90.0, 50.0, 80.0)},
                        lc.REPLICAS)
    assert (report["predicted_faster_c8"], report["predicted_faster_c32"]) == (lc.SINGLE, lc.REPLICAS)
    assert report["planner_picked_faster"] is True
    assert report["chosen_vs_best_c8"] == pytest.approx(0.8)


def test_a_predicted_tie_counts_as_one_route_and_a_measured_tie_as_faster():
    report = lc.compare({"c8": _level(50.0, 50.0, 40.0, 40.0)}, lc.SINGLE)
    assert report["predicted_faster_c8"] == lc.SINGLE
    assert report["planner_picked_faster"] is True and report["chosen_vs_best_c8"] == 1.0


def test_no_tokens_at_all_gives_no_ratio():
    report = lc.compare({"c8": _level(0.0, 0.0, 1.0, 2.0)}, lc.SINGLE)
    assert math.isnan(report["chosen_vs_best_c8"])


def test_the_kill_report_counts_lost_and_5xx_and_the_pause_across_the_kill():
    outcomes = [
        lc.StreamOutcome(200, True, (0.1, 0.2, 0.3)),  # done before the kill
        lc.StreamOutcome(200, True, (0.5, 0.9, 3.9, 4.0)),  # replayed: a 3.0 s pause
        lc.StreamOutcome(200, True, (0.8, 1.1, 1.3)),  # the other route: no pause
        lc.StreamOutcome(503, False, ()),  # refused
        lc.StreamOutcome(200, False, (0.6, 0.7), error="ROUTE_UNAVAILABLE"),  # cut off
    ]
    report = lc.kill_report(outcomes, killed_at_s=1.0)
    assert report == {"requests": 5, "lost_requests": 2, "http_5xx": 1, "streams_across_kill": 2,
                      "largest_inter_token_gap_s": pytest.approx(3.0)}


def test_a_clean_kill_window_reports_zero_losses():
    report = lc.kill_report([lc.StreamOutcome(200, True, (0.5, 1.5))], killed_at_s=1.0)
    assert (report["lost_requests"], report["http_5xx"]) == (0, 0)
    assert report["largest_inter_token_gap_s"] == pytest.approx(1.0)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command")
    benches = commands.add_parser("bench").add_subparsers(dest="bench")
    cli.register(commands, benches)
    return parser.parse_args(["bench", "serve", *argv])


@pytest.mark.parametrize(("argv", "reason"), [
    (("--compare-routes",), "COMPARE_ROUTES_WITHOUT_FLEET"),
    (("--fleet", FOUR_HOSTS, "--kill-at", "2"), "KILL_AT_WITHOUT_COMPARE_ROUTES"),
    (("--fleet", FOUR_HOSTS, "--compare-routes", "--concurrency", "8,x"), "BAD_CONCURRENCY"),
    (("--fleet", FOUR_HOSTS, "--compare-routes", "--concurrency", "1"), "CONCURRENCY_BELOW_ROUTES"),
    (("--fleet", FOUR_HOSTS, "--compare-routes", "--concurrency", "0,8"), "BAD_CONCURRENCY"),
    (("--fleet", FOUR_HOSTS, "--compare-routes", "--kill-at", "0"), "BAD_KILL_AT"),
    (("--fleet", FOUR_HOSTS, "--compare-routes", "--max-tokens", "1"), "BAD_MAX_TOKENS"),
    (("--fleet", THREE_HOSTS, "--compare-routes"), "STAGE_HOSTS_NOT_EVEN"),
])
def test_the_cli_refuses_bad_arguments_before_anything_starts(capsys, monkeypatch, argv, reason):
    monkeypatch.setattr(cli, "_quiet_logs", lambda: None)

    def no_checkpoint(*_args):
        raise AssertionError("a refusal generates no checkpoint")

    monkeypatch.setattr(cli, "_checkpoint", no_checkpoint)
    args = parse(*argv)
    assert args.func(args) == 2
    assert reason in capsys.readouterr().err


def test_compare_routes_measures_c1_to_c64_by_default_and_c64_is_kept():
    args = parse("--fleet", FOUR_HOSTS, "--compare-routes")
    assert cli._levels(args) == (1, 8, 32, 64)
    assert cli._levels(parse("--fleet", FOUR_HOSTS)) == (1, 8, 32)
    options = LayoutBenchOptions(FOUR_HOSTS, load_fleet_spec(FOUR_HOSTS), "", concurrency=(1, 8, 32, 64),
                                 kill_at_s=2.0)
    check_options(options)  # accepted: nothing raised
