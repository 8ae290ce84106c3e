"""One request, one trace: HTTP -> orchestrator -> every stage hop, across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.service.fleet_state import read_fleet
from tests.support.otlp import OtlpReceiver

pytestmark = pytest.mark.integration
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
STAGES = {"fornax-stage-worker-stage-0", "fornax-stage-worker-stage-1"}


def _fornax(*args, cwd, env, timeout=600):
    return subprocess.run([sys.executable, "-m", "apps.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_a_request_is_one_trace_across_the_orchestrator_and_every_stage(tmp_path):
    checkpoint = write_checkpoint(CheckpointRequest("tiny", tmp_path / "model", seed=6)).out_dir
    with OtlpReceiver() as receiver:
        env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        up = _fornax("up", "--checkpoint", str(checkpoint), "--stages", "2", "--backend", "numpy",
                     cwd=tmp_path, env=env)
        try:
            assert up.returncode == 0, up.stderr
            api = read_fleet(tmp_path / ".fornax").api
            body = json.dumps({"model": "fornax", "prompt": [9, 10, 11], "max_tokens": 3, "temperature": 0}).encode()
            headers = {"Content-Type": "application/json", "traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"}
            request = urllib.request.Request(f"{api}/completions", body, headers)
            with urllib.request.urlopen(request, timeout=120) as reply:
                assert reply.status == 200
        finally:
            down = _fornax("down", cwd=tmp_path, env=env, timeout=120)  # SIGTERM flushes every exporter
        assert down.returncode == 0, down.stderr
        spans = receiver.wait_for(lambda got: STAGES | {"fornax-orchestrator"}
                                  <= {s.service_name for s in got if s.trace_id == TRACE_ID})
    ours = [s for s in spans if s.trace_id == TRACE_ID]
    by_id = {s.span_id: s for s in ours}
    assert {"fornax-orchestrator", *STAGES} <= {s.service_name for s in ours}

    http = next(s for s in ours if s.name == "POST /v1/completions")
    assert http.parent_span_id == CALLER_SPAN and http.service_name == "fornax-orchestrator"
    generate = next(s for s in ours if s.name == "generate")
    assert generate.parent_span_id == http.span_id
    children = {s.name for s in ours if s.parent_span_id == generate.span_id}
    assert {"admission", "queue", "microbatch prefill"} <= children

    # Each stage hop's span descends from the request's microbatch, hop by hop.
    for hop in (s for s in ours if s.service_name in STAGES and s.name.endswith(("prefill", "decode"))):
        chain, node = [], hop
        while node.parent_span_id in by_id:
            node = by_id[node.parent_span_id]
            chain.append(node.name)
        assert "generate" in chain and chain[-1] == "POST /v1/completions"
    stage_spans = {(s.service_name, s.name) for s in ours if s.service_name in STAGES}
    for service in STAGES:
        assert {(service, name) for name in ("queue", "compute", "unpack")} <= stage_spans
    assert ("fornax-stage-worker-stage-0", "pack") in stage_spans
    assert ("fornax-stage-worker-stage-0", "transfer to stage-1") in stage_spans
