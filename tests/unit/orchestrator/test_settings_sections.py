"""Each settings section writes what it reads: from_env(to_env(x)) == x, and a bad value is
refused with an error that names its variable."""

from __future__ import annotations

import dataclasses

import pytest

from libs.common.kinds import Backend, DType
from libs.service.errors import InvalidArgument
from services.orchestrator.api.settings import HttpSettings
from services.orchestrator.config import SECTIONS, OrchestratorConfig
from services.orchestrator.engine.admission import KvFullPolicy
from services.orchestrator.engine.prefix_salt import PrefixPolicy
from services.orchestrator.engine.settings import DriftSettings, ServingSettings
from services.orchestrator.route.backend_choice import SwitchPolicy
from services.orchestrator.route.settings import InprocessSettings, RouteSettings

NON_DEFAULT = [
    HttpSettings(port=8080, api_key="k", max_body_bytes=1024, send_buffer_bytes=65536, tls_cert="/c.pem",
                 tls_key="/k.pem", insecure=True),
    ServingSettings(max_live_requests=8, default_max_tokens=32, pipeline_spare_microbatches=0,
                    max_tokens_per_step=256, min_prefill_chunk_tokens=16, default_deadline_s=2.5,
                    idle_write_timeout_s=0.0, release_budget_s=1.25, recovery_timeout_s=0.0, max_tokens_cap=64,
                    max_prompt_tokens=512, prefix_cache=PrefixPolicy.GLOBAL, kv_full=KvFullPolicy.REJECT),
    DriftSettings(relative_bound=0.25, sustain_rounds=5),
    RouteSettings(planner_addr="p:1", artifact_builder_addr="a:2", registry_addr="r:3", plan_mode="deployment",
                  stage_workers=("w:1", "w:2"), model_id="tiny", reference_stage_workers=("n:1", "n:2"),
                  stage_cpu_sets=((0, 1), (2, 5)), compile_cache_dir="/cache", checkpoint="/ckpt", backend=None,
                  boundary_dtype=DType.FP32, hop_boundary_dtypes=(DType.FP16,), weights_policy="q8_0",
                  worker_weights=("fp32", "q8_0"), max_switch=SwitchPolicy.ALWAYS, max_switch_rows=(1, 4, 32),
                  state_dir="/state", stage_kv_limit_bytes=1 << 30, drain_timeout_s=7.5, rejoin_timeout_s=3.0),
    RouteSettings(backend=Backend.MAX),
    InprocessSettings(checkpoint="/ckpt", stages=2, backend=Backend.MAX),
]


@pytest.mark.parametrize("section", SECTIONS.values(), ids=lambda s: s.__name__)
def test_defaults_round_trip(section):
    assert section.from_env(section().to_env()) == section()
    assert section.from_env({}) == section()


@pytest.mark.parametrize("settings", NON_DEFAULT, ids=lambda s: type(s).__name__)
def test_non_default_settings_round_trip(settings):
    assert settings != type(settings)()
    assert type(settings).from_env(settings.to_env()) == settings


def test_every_section_is_covered_by_a_non_default_instance():
    assert {type(s) for s in NON_DEFAULT} == set(SECTIONS.values())


def test_the_whole_orchestrator_config_round_trips_through_its_variables():
    cfg = OrchestratorConfig.from_env([], {"FORNAX_STAGE_WORKERS": "a:1,b:2", "FORNAX_BACKEND": "worker"})
    again = OrchestratorConfig.from_env([], cfg.to_env())
    # The shared server settings are not a section (their audit path follows FORNAX_STATE_DIR).
    assert dataclasses.replace(again, server=cfg.server) == cfg and again.route.backend is None


def test_to_env_writes_only_the_named_settings_and_refuses_unknown_names():
    assert RouteSettings(stage_workers=("a:1",)).to_env("stage_workers") == {"FORNAX_STAGE_WORKERS": "a:1"}
    with pytest.raises(KeyError, match="no setting stage_worker"):
        RouteSettings().to_env("stage_worker")


@pytest.mark.parametrize(("section", "variable", "raw", "reason"), [
    (ServingSettings, "FORNAX_MAX_LIVE_REQUESTS", "many", "INVALID_SETTING"),
    (ServingSettings, "FORNAX_DEFAULT_DEADLINE_S", "soon", "INVALID_SETTING"),
    (ServingSettings, "FORNAX_RECOVERY_TIMEOUT_S", "-1", "INVALID_SETTING"),
    (ServingSettings, "FORNAX_IDLE_WRITE_TIMEOUT_S", "nan", "INVALID_SETTING"),
    (ServingSettings, "FORNAX_PREFIX_CACHE", "everyone", "INVALID_PREFIX_CACHE"),
    (ServingSettings, "FORNAX_KV_FULL", "drop", "INVALID_KV_FULL"),
    (HttpSettings, "FORNAX_HTTP_PORT", "80a", "INVALID_SETTING"),
    (DriftSettings, "FORNAX_DRIFT_RELATIVE_BOUND", "0", "INVALID_SETTING"),
    (DriftSettings, "FORNAX_DRIFT_SUSTAIN_ROUNDS", "0", "INVALID_SETTING"),
    (RouteSettings, "FORNAX_DRAIN_TIMEOUT_S", "-5", "INVALID_SETTING"),
    (RouteSettings, "FORNAX_REJOIN_TIMEOUT_S", "-1", "INVALID_SETTING"),
    (RouteSettings, "FORNAX_PLAN_MODE", "careful", "INVALID_PLAN_MODE"),
    (RouteSettings, "FORNAX_BACKEND", "tpu", "INVALID_SETTING"),
    (RouteSettings, "FORNAX_HOP_BOUNDARY_DTYPES", "bf16,fp8", "INVALID_SETTING"),
    (RouteSettings, "FORNAX_WEIGHTS", "int3", "INVALID_SETTING"),
    (RouteSettings, "FORNAX_STAGE_CPU_SETS", "0;x", "INVALID_SETTING"),
    (RouteSettings, "FORNAX_MAX_SWITCH", "usually", "INVALID_MAX_SWITCH"),
    (InprocessSettings, "FORNAX_INPROCESS_BACKEND", "cuda", "INVALID_SETTING"),
])
def test_a_bad_value_is_refused_naming_its_variable(section, variable, raw, reason):
    with pytest.raises(InvalidArgument) as info:
        section.from_env({variable: raw})
    assert (info.value.field, info.value.reason) == (variable, reason)
    bad_item = raw.replace(";", ",").split(",")[-1]  # a list names the item it refuses
    assert variable in str(info.value) and repr(bad_item) in str(info.value)


def test_a_flag_is_read_as_its_variable_and_a_bad_flag_names_that_variable():
    with pytest.raises(InvalidArgument) as info:
        OrchestratorConfig.from_env(["--recovery-timeout-s", "-2"], {})
    assert info.value.field == "FORNAX_RECOVERY_TIMEOUT_S"


def test_a_tls_certificate_without_its_key_stops_startup():
    with pytest.raises(SystemExit, match="FORNAX_HTTP_TLS_CERT and FORNAX_HTTP_TLS_KEY"):
        HttpSettings.from_env({"FORNAX_HTTP_TLS_CERT": "/c.pem"})


def test_the_engine_built_without_settings_is_the_engine_the_service_runs():
    """One default per setting: a bare ServingConfig (the Python API's, the benches') and the
    HTTP front's config equal what the service builds when no variable is set."""
    from services.orchestrator.api.http_api import HttpConfig
    from services.orchestrator.engine.serving import ServingConfig

    assert ServingSettings().serving_config() == ServingConfig()
    assert HttpSettings().http_config(ServingSettings().idle_write_timeout_s) == HttpConfig()
