"""The layer-streamed reference holds one decoded layer, not the model: on `small` (about 250M
parameters, 0.99 GB as float32) its peak RSS over its own baseline stays within two of its
largest decoded layer (about 156 MB), run in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from libs.common.kinds import DType
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint

pytest.importorskip("transformers")

# What the child runs: the reference over the route's artifacts, as `fornax parity --served` does.
_RUN = """
import json, sys
import numpy as np
from pathlib import Path
from libs.model.streamed_reference import artifact_source, streamed_logits
rng = np.random.default_rng(0)
sequences = [rng.integers(0, 16384, 32).tolist() for _ in range(3)]
result = streamed_logits(artifact_source([Path(p) for p in sys.argv[1:]]), sequences)
print(json.dumps({"peak": result.peak_rss_bytes, "baseline": result.baseline_rss_bytes,
                  "layer": result.largest_layer_f32_bytes, "seconds": result.seconds}))
"""


@pytest.mark.slow
def test_peak_memory_is_about_one_layer_not_the_model_on_small(tmp_path):
    from services.artifact_builder.build import BuildOptions, BuildResult, build_stage_artifacts
    from services.artifact_builder.snapshot import inspect_checkpoint
    from services.artifact_builder.staging import plan_from_ranges

    summary = write_checkpoint(CheckpointRequest("small", tmp_path / "small"))
    whole_f32 = summary.parameter_count * 4
    options = BuildOptions(tmp_path / "out", DType.FP32, weights_policy="q4_k_m")
    result = [e for e in build_stage_artifacts(inspect_checkpoint(summary.out_dir), plan_from_ranges(((0, 3), (3, 6))),
                                               options) if isinstance(e, BuildResult)][-1]
    done = subprocess.run([sys.executable, "-c", _RUN, *(str(s.artifact_dir) for s in result.stages)],
                          capture_output=True, text=True, timeout=300, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    growth = figures["peak"] - figures["baseline"]
    print(f"peak_rss={figures['peak']} baseline={figures['baseline']} growth={growth} "
          f"largest_layer_f32={figures['layer']} model_f32={whole_f32} seconds={figures['seconds']:.1f}")
    assert whole_f32 > 5 * figures["layer"]  # holding the model would break the bound below
    assert growth < 2 * figures["layer"], figures
    assert growth < whole_f32 / 3, figures
