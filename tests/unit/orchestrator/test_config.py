from __future__ import annotations

import pytest

from services.orchestrator.config import OrchestratorConfig, serving_config


def test_environment_and_flags_reach_the_serving_config():
    env = {"FORNAX_DEFAULT_DEADLINE_S": "2.5", "FORNAX_CHECKPOINT": "/ckpt",
           "FORNAX_STAGE_WORKERS": "127.0.0.1:1, 127.0.0.1:2", "FORNAX_BOUNDARY_DTYPE": "fp32",
           "FORNAX_MAX_LIVE_REQUESTS": "8", "FORNAX_API_KEY": "k"}
    cfg = OrchestratorConfig.from_env(["--default-max-tokens", "32", "--backend", "max"], env)
    assert (cfg.route.checkpoint, cfg.route.stage_workers) == ("/ckpt", ("127.0.0.1:1", "127.0.0.1:2"))
    assert (cfg.route.boundary_dtype, cfg.route.backend, cfg.http.api_key) == ("fp32", "max", "k")
    serving = serving_config(cfg)
    assert serving.default_deadline_budget_ns == 2_500_000_000
    assert (serving.max_live_requests, serving.default_max_tokens) == (8, 32)


def test_every_request_has_a_deadline_unless_disabled():
    default = serving_config(OrchestratorConfig.from_env([], {}))
    assert default.default_deadline_budget_ns == 600 * 10**9
    assert default.stall_timeout_s == 30.0 and default.release_budget_s == 10.0
    off = serving_config(OrchestratorConfig.from_env([], {"FORNAX_DEFAULT_DEADLINE_S": "0"}))
    assert off.default_deadline_budget_ns is None


def test_reference_workers_cpu_shares_and_cache_dir():
    env = {"FORNAX_STAGE_WORKERS": "127.0.0.1:1,127.0.0.1:2",
           "FORNAX_REFERENCE_STAGE_WORKERS": "127.0.0.1:3, 127.0.0.1:4",
           "FORNAX_STAGE_CPU_SETS": "0-1;2,5", "FORNAX_COMPILE_CACHE_DIR": "/cache"}
    cfg = OrchestratorConfig.from_env([], env)
    assert cfg.route.reference_stage_workers == ("127.0.0.1:3", "127.0.0.1:4")
    assert cfg.route.stage_cpu_sets == ((0, 1), (2, 5))
    assert cfg.route.compile_cache_dir == "/cache"
    plain = OrchestratorConfig.from_env([], {})
    route = plain.route
    assert (route.reference_stage_workers, route.stage_cpu_sets, route.compile_cache_dir) == ((), (), None)


def test_reference_workers_must_match_the_stages():
    import pytest

    from libs.service.errors import FailedPrecondition
    from services.orchestrator.coldstart_setup import compiler_factory

    cfg = OrchestratorConfig.from_env([], {"FORNAX_STAGE_WORKERS": "a:1,b:2", "FORNAX_REFERENCE_STAGE_WORKERS": "c:3"})
    with pytest.raises(FailedPrecondition) as info:
        compiler_factory(cfg)
    assert info.value.reason == "REFERENCE_WORKERS_MISMATCH"
    assert compiler_factory(OrchestratorConfig.from_env([], {"FORNAX_STAGE_WORKERS": "a:1"})) is None


def test_chunked_prefill_is_configured_by_environment_or_flag():
    off = serving_config(OrchestratorConfig.from_env([], {})).scheduler
    assert (off.max_tokens_per_step, off.min_prefill_chunk_tokens) == (0, 32)
    by_env = serving_config(OrchestratorConfig.from_env([], {"FORNAX_MAX_TOKENS_PER_STEP": "256",
                                                             "FORNAX_MIN_PREFILL_CHUNK_TOKENS": "16"})).scheduler
    assert (by_env.max_tokens_per_step, by_env.min_prefill_chunk_tokens) == (256, 16)
    by_flag = OrchestratorConfig.from_env(["--max-tokens-per-step", "64"], {"FORNAX_MAX_TOKENS_PER_STEP": "256"})
    assert by_flag.serving.max_tokens_per_step == 64


def test_an_impossible_step_budget_stops_startup_naming_the_variable():
    from libs.service.errors import InvalidArgument

    for variable, raw in (("FORNAX_MAX_TOKENS_PER_STEP", "-1"), ("FORNAX_MIN_PREFILL_CHUNK_TOKENS", "0")):
        with pytest.raises(InvalidArgument, match=f"{variable}='{raw}' is not an integer >= ") as info:
            OrchestratorConfig.from_env([], {variable: raw})
        assert info.value.field == variable


def test_the_max_switch_policy_is_measured_unless_forced_and_fails_closed():
    from libs.service.errors import InvalidArgument
    from services.orchestrator.route.backend_choice import SwitchPolicy

    assert OrchestratorConfig.from_env([], {}).route.max_switch is SwitchPolicy.MEASURED
    assert OrchestratorConfig.from_env([], {"FORNAX_MAX_SWITCH": "always"}).route.max_switch is SwitchPolicy.ALWAYS
    assert OrchestratorConfig.from_env(["--max-switch", "measured"],
                                       {"FORNAX_MAX_SWITCH": "always"}).route.max_switch is SwitchPolicy.MEASURED
    with pytest.raises(InvalidArgument) as err:
        OrchestratorConfig.from_env([], {"FORNAX_MAX_SWITCH": "usually"})
    assert err.value.reason == "INVALID_MAX_SWITCH" and err.value.field == "FORNAX_MAX_SWITCH"


@pytest.mark.parametrize(("raw", "rows"), [(None, (1, 8)), ("8, 1,32", (1, 8, 32)), ("4", (4,))])
def test_the_switch_is_measured_at_the_configured_rows(raw, rows):
    env = {} if raw is None else {"FORNAX_MAX_SWITCH_ROWS": raw}
    assert OrchestratorConfig.from_env([], env).route.max_switch_rows == rows


@pytest.mark.parametrize("raw", ["0,8", "1,2000", "one", ",", "1,2,3,4,5,6,7,8,9"])
def test_bad_switch_rows_fail_closed(raw):
    from libs.service.errors import InvalidArgument

    with pytest.raises(InvalidArgument) as err:
        OrchestratorConfig.from_env([], {"FORNAX_MAX_SWITCH_ROWS": raw})
    assert err.value.reason == "INVALID_MAX_SWITCH_ROWS" and err.value.field == "FORNAX_MAX_SWITCH_ROWS"


def test_the_kv_full_policy_queues_by_default_and_a_bad_value_is_refused():
    from libs.service.errors import InvalidArgument
    from services.orchestrator.engine.admission import KvFullPolicy

    assert serving_config(OrchestratorConfig.from_env([], {})).kv_full is KvFullPolicy.QUEUE
    assert serving_config(OrchestratorConfig.from_env([], {"FORNAX_KV_FULL": "reject"})).kv_full is KvFullPolicy.REJECT
    flag = OrchestratorConfig.from_env(["--kv-full", "queue"], {"FORNAX_KV_FULL": "reject"})
    assert serving_config(flag).kv_full is KvFullPolicy.QUEUE
    with pytest.raises(InvalidArgument) as info:
        OrchestratorConfig.from_env([], {"FORNAX_KV_FULL": "drop"})
    assert info.value.reason == "INVALID_KV_FULL"
