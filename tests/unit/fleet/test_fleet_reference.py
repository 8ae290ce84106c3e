"""A netns fleet serves at once where memory allows: which hosts get a numpy reference worker,
the memory-fit rule, what `fornax up` prints, and how the workers reach the orchestrator."""

from __future__ import annotations

from pathlib import Path

from apps.fleet.fleet_reference import (
    COLD_COMPILE_S_PER_GRAPH_CORE,
    GIB,
    NO_REFERENCE,
    HostStageMemory,
    decide_references,
)
from apps.fleet.fleet_reference_inputs import reference_decision
from apps.fleet.launcher import FleetOptions
from apps.fleet.netns_compose import reference_addresses, worker_process
from apps.fleet.netns_plan import CgroupVersion, make_plan
from apps.fleet.spec import load_fleet_spec
from libs.common.kinds import Backend
from libs.service.fleet_state import ServiceEntry

FLEETS = Path(__file__).resolve().parents[3] / "fleets"


def _tiny(root: Path) -> Path:
    from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint

    return write_checkpoint(CheckpointRequest("tiny", root / "tiny")).out_dir


def _host(name: str, backend: Backend, limit_gib: float, stage_gib: float, reference_gib: float,
          graphs: int = 4, cores: float = 1.0) -> HostStageMemory:
    return HostStageMemory(name, backend, int(limit_gib * GIB), int(stage_gib * GIB), int(reference_gib * GIB),
                           graphs, cores)


def test_every_max_host_gets_a_reference_worker_when_every_host_holds_the_switch():
    decision = decide_references((_host("alpha", Backend.MAX, 6, 2, 2.5), _host("beta", Backend.NUMPY, 3, 1, 1)))
    assert decision.reference_hosts == {"alpha"} and decision.serves_at_once
    (line,) = decision.lines
    assert line.startswith("alpha: serves at once on a numpy reference worker inside the host while its 4 "
                           "uncompiled MAX graph(s) compile; then the route moves to MAX per --max-switch")
    cached = decide_references((_host("alpha", Backend.MAX, 6, 2, 2.5, graphs=0),))
    assert "while its MAX graphs load from the compile cache; then" in cached.lines[0]
    assert "numpy reference 2.50 GiB + max stage 2.00 GiB = 4.50 GiB of its 6.00 GiB limit" in line


def test_the_switch_must_fit_the_limit_exactly_or_below():
    assert _host("a", Backend.MAX, 4.5, 2, 2.5).fits
    assert not _host("a", Backend.MAX, 4.49, 2, 2.5).fits


def test_a_max_host_too_small_for_both_workers_serves_after_compiling_and_says_how_long():
    decision = decide_references((_host("alpha", Backend.MAX, 4, 2, 2.5, graphs=4, cores=0.5),
                                  _host("gamma", Backend.MAX, 8, 2, 2.5, graphs=0),
                                  _host("beta", Backend.NUMPY, 3, 2, 2)))
    assert decision.reference_hosts == frozenset() and not decision.serves_at_once
    alpha, gamma = decision.lines
    assert alpha.startswith("alpha: serves only after compiling, no numpy reference worker: its memory limit "
                            "cannot hold a reference stage beside its MAX stage (numpy reference 2.50 GiB + max "
                            "stage 2.00 GiB = 4.50 GiB of its 4.00 GiB limit)")
    # four graphs at half a core: 4 x 60 s / 0.5
    assert "expected wait about 8 min for 4 uncompiled MAX graph(s) at 0.5 cores (prediction" in alpha
    assert gamma.startswith("gamma: serves only after compiling, the route needs every stage and alpha cannot "
                            "hold the switch")
    assert gamma.endswith("no graph to compile: it serves once its stage loads")


def test_a_numpy_host_short_of_two_generations_is_warned_of_not_decisive():
    decision = decide_references((_host("alpha", Backend.MAX, 6, 2, 2), _host("beta", Backend.NUMPY, 3, 1.6, 1.6)))
    assert decision.reference_hosts == {"alpha"}  # beta's worker refuses an overlap that does not fit
    assert decision.lines[1] == ("beta: may not hold its stage twice for the switch (a second generation 1.60 GiB + "
                                 "numpy stage 1.60 GiB = 3.20 GiB of its 3.00 GiB limit, at the widest range it "
                                 "could be given); its worker then refuses the second generation and the route "
                                 "stays on numpy (switch_failed)")


def test_the_control_hosts_services_and_compiles_count_against_its_limit():
    host = HostStageMemory("alpha", Backend.MAX, 6 * GIB, 2 * GIB, 2 * GIB, 3, 1.0, other_bytes=2 * GIB + 1)
    decision = decide_references((host,))
    assert not host.fits and decision.reference_hosts == frozenset()
    assert "+ control services and background compiles 2.00 GiB = 6.00 GiB of its 6.00 GiB limit" in decision.lines[0]


def test_a_fleet_of_numpy_hosts_needs_no_reference_worker():
    assert decide_references((_host("beta", Backend.NUMPY, 3, 1, 1),)) == NO_REFERENCE


def test_compile_wait_is_graphs_times_the_per_core_figure_capped_at_one_core():
    assert _host("a", Backend.MAX, 6, 1, 1, graphs=3, cores=1.5).compile_wait_s == 3 * COLD_COMPILE_S_PER_GRAPH_CORE


def test_the_shipped_unlike_fleet_on_tiny_starts_a_reference_worker_on_its_max_host(tmp_path):
    spec = load_fleet_spec(FLEETS / "two-unlike-hosts.yaml")
    checkpoint = str(_tiny(tmp_path))
    decision = reference_decision(spec, checkpoint, None, serve_while_compiling=True, replica_routes=False)
    assert decision.reference_hosts == {"alpha"}
    assert decision.lines[0].startswith("alpha: serves at once")
    # alpha runs the control services and the background compiles too: they count on its limit
    assert "+ control services and background compiles" in decision.lines[0]
    assert reference_decision(spec, checkpoint, None, serve_while_compiling=False,
                              replica_routes=False) == NO_REFERENCE
    assert reference_decision(spec, None, None, serve_while_compiling=True, replica_routes=False) == NO_REFERENCE
    routes = reference_decision(spec, checkpoint, None, serve_while_compiling=True, replica_routes=True)
    assert routes.reference_hosts == frozenset()
    assert routes.lines == ("MAX hosts serve only after their graphs compile: replica routes do not serve on "
                            "reference workers",)


def test_a_deployment_serves_no_reference_route_since_no_gate_passed_it(tmp_path):
    # The planner refuses the numpy reference route in deployment mode (no calibration of it):
    # the fleet waits for the MAX graphs instead, and says why.
    spec = load_fleet_spec(FLEETS / "two-unlike-hosts.yaml")
    decision = reference_decision(spec, str(_tiny(tmp_path)), None, serve_while_compiling=True,
                                  replica_routes=False, deployment=True)
    assert decision.reference_hosts == frozenset()
    assert decision.lines == ("MAX hosts serve only after their graphs compile: deployment mode installs only a "
                              "route `fornax qualify` passed, and the numpy reference route is not one",)


def test_a_packed_reference_stage_counts_its_stored_bytes_and_one_decoded_weight(tmp_path):
    from apps.fleet.fleet_reference_inputs import _decode_scratch_bytes, _numpy_weight_bytes
    from libs.model.config import load_config

    cfg = load_config(_tiny(tmp_path))
    end = cfg.num_hidden_layers
    assert _decode_scratch_bytes(cfg, "fp32", 0, end) == 0  # float32 is held as stored, nothing decoded
    packed, full = _numpy_weight_bytes(cfg, "q4_k_m", 0, end), _numpy_weight_bytes(cfg, "fp32", 0, end)
    assert packed < full / 4  # the packed bytes, never a float32 copy of them
    embed = cfg.vocab_size * cfg.hidden_size * 4
    assert _decode_scratch_bytes(cfg, "q4_k_m", 0, end) >= embed > 0  # the largest weight, in float32


def _entry(name: str, port: int) -> ServiceEntry:
    return ServiceEntry(name, "stage_worker", f"198.18.0.1:{port}", "198.18.0.1:1", 1, "log")


def test_a_numpy_host_is_its_own_reference_and_a_fleet_without_reference_workers_names_none():
    entries = {e.name: e for e in (_entry("stage_worker_0", 10), _entry("stage_worker_0_reference", 11),
                                   _entry("stage_worker_1", 12))}
    assert reference_addresses(entries, 2) == ("198.18.0.1:11", "198.18.0.1:12")
    del entries["stage_worker_0_reference"]
    assert reference_addresses(entries, 2) == ()


def test_the_reference_worker_runs_numpy_inside_its_host_with_its_own_state(tmp_path):
    spec = load_fleet_spec(FLEETS / "two-unlike-hosts.yaml")
    plan = make_plan(spec, "0a0b0c", CgroupVersion.V2, (0, 1))
    alpha = plan.host("alpha")
    options = FleetOptions(state_dir=tmp_path, checkpoint="/ckpt")
    main, reference = worker_process(options, alpha, 0), worker_process(options, alpha, 0, reference=True)
    assert (main.name, reference.name) == ("stage_worker_0", "stage_worker_0_reference")
    assert (main.env["FORNAX_BACKEND"], reference.env["FORNAX_BACKEND"]) == ("max", "numpy")
    assert reference.kind == "stage_worker" and reference.host == main.host == alpha.address
    assert reference.env["FORNAX_STATE_DIR"].endswith("hosts/alpha/stage_worker_0_reference")
    assert reference.env["FORNAX_KV_LIMIT_BYTES"] == str(2**28) and "FORNAX_KV_LIMIT_BYTES" not in main.env
    assert reference.wrap is not None and reference.wrap(["x"]) == main.wrap(["x"])  # same cgroup and netns


def test_a_host_is_bounded_by_the_widest_range_it_could_hold_at_either_end():
    from apps.fleet.fleet_reference_inputs import _widest_ranges

    assert _widest_ranges(6, 2) == [(0, 5), (1, 6)]
    assert _widest_ranges(27, 3) == [(0, 25), (2, 27)]
    assert _widest_ranges(2, 4) == [(0, 1), (1, 2)]
