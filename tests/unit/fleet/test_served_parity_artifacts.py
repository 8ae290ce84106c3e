"""`fornax parity --served` finds the route's artifacts where a fleet keeps them: the builder's
store or a stage worker's cache, on the control host or under a netns host's directory."""

from __future__ import annotations

import pytest

from apps.cli.served_parity import ARTIFACT_SEARCH_DEPTH, find_artifact

HASH = "sha256:" + "ab" * 32
NAME = "sha256-" + "ab" * 32


@pytest.mark.parametrize("where", [
    "artifacts/artifacts",                                   # a local fleet's builder store
    "stage_worker_1/artifact_cache/artifacts",               # a local stage worker's cache
    "hosts/alpha/artifact_builder/artifacts",                # a netns fleet's control host
    "hosts/beta/stage_worker_0/artifact_cache/artifacts",    # a netns stage host
])
def test_an_artifact_is_found_where_a_fleet_keeps_it(tmp_path, where):
    (tmp_path / "logs").mkdir()
    target = tmp_path / where / NAME
    target.mkdir(parents=True)
    assert find_artifact(tmp_path, HASH) == target
    assert find_artifact(tmp_path, "sha256:" + "cd" * 32) is None


def test_the_search_stops_below_its_depth(tmp_path):
    deep = tmp_path.joinpath(*(["d"] * (ARTIFACT_SEARCH_DEPTH + 1)), NAME)
    deep.mkdir(parents=True)
    assert find_artifact(tmp_path, HASH) is None
