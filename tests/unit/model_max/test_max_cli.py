"""`fornax max warmup` compiles (or fetches) every graph kind a checkpoint needs."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("max")

from apps.cli.main import main  # noqa: E402

# compiles on a cold cache;
# cold compiles can outlast the default 600 s test timeout on a busy 2-core host.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_warmup_reports_every_graph_kind(max_checkpoint, capsys):
    assert main(["max", "warmup", "--checkpoint", str(max_checkpoint), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload["seconds_per_graph"]) == {"embed", "final", "dense_layer", "moe_layer", "expert"}
    assert payload["build"].startswith("max ") and "physical" in payload["figure_class"]


def test_warmup_rejects_an_absent_gpu(max_checkpoint):
    from max.driver import accelerator_count

    from libs.model.errors import BackendUnavailableError

    if accelerator_count() > 0:
        pytest.skip("an accelerator is present")
    with pytest.raises(BackendUnavailableError):
        main(["max", "warmup", "--checkpoint", str(max_checkpoint), "--device", "gpu"])
