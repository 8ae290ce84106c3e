"""`fornax profile`: a running local fleet's workers fetch the profiling artifacts from the builder,
profile themselves and their links, and the signed records stay in the fleet's registry; on a
netns fleet the half-core host measures slower than the 1.5-core host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from apps.fleet.netns import read_record
from libs.common.kinds import Backend
from libs.security.cli_credentials import operator_credentials
from libs.service.channels import ChannelConfig
from libs.service.fleet_state import read_fleet
from services.evidence_registry.client import ClientOptions
from services.planner.inventory import Node
from services.planner.profile_source import fetch_profile_records
from services.planner.profiles import book_from_records
from services.planner.reserve import choose_reserve
from tests.integration.orchestrator.harness import tiny_checkpoint

pytestmark = pytest.mark.integration
SMALL = ["--runs", "2", "--prefill-lengths", "4,8", "--decode-batches", "1,2", "--decode-contexts", "8",
         "--min-run-ms", "5"]


def _fornax(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apps.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def test_profile_stores_signed_records_a_planner_reads_back(checkpoint, tmp_path):
    state = tmp_path / "state"
    missing = _fornax("profile", "--state-dir", str(state), "--checkpoint", str(checkpoint))
    assert missing.returncode == 2 and "give --fleet FILE" in missing.stderr
    up = _fornax("up", "--state-dir", str(state), "--stages", "2", "--read-root", str(checkpoint))
    assert up.returncode == 0, up.stderr
    try:
        done = _fornax("profile", "--state-dir", str(state), "--checkpoint", str(checkpoint), "--json", *SMALL)
        assert done.returncode == 0, done.stderr
        document = json.loads(done.stdout)
        assert [s["profile"]["host"]["host"] for s in document["stages"]] == ["stage_worker_0", "stage_worker_1"]
        assert [(lp["profile"]["from_host"], lp["profile"]["to_host"]) for lp in document["links"]] == [
            ("stage_worker_0", "stage_worker_1"), ("stage_worker_1", "stage_worker_0")]
        assert all(e["evidence_class"] == "physical" for e in document["stages"] + document["links"])
        fleet = read_fleet(state)
        assert fleet is not None
        options = ClientOptions(channel=ChannelConfig(credentials=operator_credentials(state, env={})))
        book = book_from_records(fetch_profile_records(fleet.entry("evidence_registry").grpc, options))
        assert sorted(r.profile.host.host for r in book.stages) == ["stage_worker_0", "stage_worker_1"]
        assert len(book.links) == 2
        assert book.stage_record("stage_worker_0").record_id == document["stages"][0]["record_id"]
        assert book.stage_problem("stage_worker_0", document["model_snapshot"], "numpy", time.time_ns()) is None
        kinds = [k.kind for k in book.stage_record("stage_worker_1").profile.kinds]
        assert kinds == ["dense", "moe", "embed", "head"]  # from the first and last profiling artifacts
        # the worker's own resident memory beyond weights and KV, after each artifact loads and after its steps
        resident = book.stage_record("stage_worker_0").profile.runtime_resident
        assert resident is not None and len(resident.samples) == 4
        assert [s.point.split(" of ")[0] for s in resident.samples] == ["after load", "after the profiled steps"] * 2
        assert all(s.rss_bytes > s.anon_bytes > 0 for s in resident.samples)
        # every weight read by then: held as mapped file pages or as arrays of the worker's own
        assert all(s.weight_file_bytes + s.weight_copy_bytes > 0 for s in resident.samples[1::2])
        assert 16 << 20 < resident.reserve_bytes < 4 << 30
        node = Node("stage_worker_0", Backend.NUMPY, 4 << 30, 1e9, 1e9, (), (), reserve_bytes=512 << 20)
        chosen = choose_reserve(node, "stage_worker_0", book, document["model_snapshot"], "fp32", time.time_ns())
        assert chosen.measured and chosen.reserve_bytes == resident.reserve_bytes

        q8 = _fornax("profile", "--state-dir", str(state), "--checkpoint", str(checkpoint), "--json",
                     "--weights", "q8_0", *SMALL)
        assert q8.returncode == 0, q8.stderr
        assert "in q8_0 for BACKEND_NUMPY" in q8.stderr and "(q8_0)" in q8.stderr
        timed = json.loads(q8.stdout)["stages"][0]["profile"]
        fp32 = document["stages"][0]["profile"]
        assert (timed["weights_policy"], fp32["weights_policy"]) == ("q8_0", "fp32")
        resident = {p["weights_policy"]: {k["kind"]: k["resident_bytes"] for k in p["kinds"]} for p in (timed, fp32)}
        # 34 bytes per 32 weights against 128: the experts and projections shrink, norms and router stay
        assert 0.25 < resident["q8_0"]["moe"] / resident["fp32"]["moe"] < 0.4
    finally:
        _fornax("down", "--state-dir", str(state))


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/proc/self/ns/net").exists(),
                    reason="netns fleets need root and namespaces")
def test_on_a_netns_fleet_the_half_core_host_measures_slower(checkpoint, tmp_path):
    fleet_file = tmp_path / "two-unlike-numpy.yaml"
    fleet_file.write_text(yaml.safe_dump({
        "version": 1, "control_host": "alpha", "boundary_dtype": "fp32",
        "hosts": [
            {"name": "alpha", "backend": "numpy", "cpu_cores": 1.5, "memory_limit": "3GiB",
             "link": {"rate": "1Gbit/s"}},
            {"name": "beta", "backend": "numpy", "cpu_cores": 0.5, "memory_limit": "2GiB",
             "link": {"rate": "1Gbit/s"}},
        ],
    }))
    state = tmp_path / "state"
    done = _fornax("profile", "--fleet", str(fleet_file), "--state-dir", str(state), "--checkpoint",
                   str(checkpoint), "--json", "--runs", "3", "--prefill-lengths", "64", "--decode-batches", "1,8",
                   "--decode-contexts", "64")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    hosts = {s["profile"]["host"]["host"]: s["profile"] for s in document["stages"]}
    # on 2 CPUs alpha's half core would land on beta's CPU: alpha keeps the CPU it holds alone
    # (README, one-box cpusets), so the quotas the workers report are 1 and 0.5 cores
    expected = {"alpha": 1.5, "beta": 0.5} if (os.cpu_count() or 1) > 2 else {"alpha": 1.0, "beta": 0.5}
    assert {h: hosts[h]["host"]["cpu_quota_cores"] for h in expected} == expected

    def least_disturbed_decode_s(profile) -> float:
        """Dense and MoE decode figures, each at its fastest run: the host's unloaded speed."""
        return sum(f["low"] for k in profile["kinds"] if k["kind"] in ("dense", "moe")
                   for f in k["decode_s_per_microbatch"].values())

    assert {(lp["profile"]["from_host"], lp["profile"]["to_host"]) for lp in document["links"]} == {
        ("alpha", "beta"), ("beta", "alpha")}
    # the hosts are gone; the registry's records stay under the state directory for a later `fornax up`
    assert read_record(state) is None
    assert (state / "hosts" / "alpha" / "evidence_registry" / "registry.db").is_file()
    beta, alpha = least_disturbed_decode_s(hosts["beta"]), least_disturbed_decode_s(hosts["alpha"])
    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1):
        # A quota binds only while the machine has cores to spare; on a saturated machine every
        # host gets less than its quota and the two measure alike.
        pytest.skip(f"load average {load:.1f} saturates {os.cpu_count()} CPUs: beta {beta:.4g} s, alpha {alpha:.4g} s")
    assert beta > 1.3 * alpha
