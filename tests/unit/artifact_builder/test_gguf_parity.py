"""`fornax parity --checkpoint FILE.gguf`: stages over the file's builds against numpy stages over
its own weights, with the figure's evidence; what cannot apply to a GGUF is refused."""

from __future__ import annotations

import pytest

from apps.cli.main import main
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from tests.support.gguf_files import mixed_types, write_gguf


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf_parity")
    checkpoint = write_checkpoint(CheckpointRequest("tiny", root / "tiny", seed=0)).out_dir
    path = root / "mixed.gguf"
    write_gguf(checkpoint, path, mixed_types)
    return path


def test_numpy_stages_over_the_files_build_agree_with_its_own_weights_and_say_where_the_figure_came_from(
        mixed_gguf, capsys):
    code = main(["parity", "--checkpoint", str(mixed_gguf), "--backend", "numpy", "--stages", "2",
                 "--decode-steps", "4"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "top-1 agreement with the reference: 1.000" in out
    assert "held converted on the numpy stages (2 kinds" in out  # each stage's kv_b_proj, reassembled
    evidence = next(line for line in out.splitlines() if line.startswith("evidence: "))
    assert evidence.startswith("evidence: physical; CPU ")
    assert f"`fornax parity --checkpoint {mixed_gguf} --backend numpy --stages 2" in evidence
    assert "snapshot " in evidence and evidence.split("snapshot ")[1].strip()
    assert out.rstrip().endswith("PASS (top-1 >= 0.95)")


@pytest.mark.parametrize("flags, said", [
    (["--weights", "q4_k_m"], "drop --weights"),
    (["--against-source"], "drop --against-source"),
    (["--kv-dtype", "bf16"], "drop --against-source and --kv-dtype"),
])
def test_parity_refuses_what_cannot_apply_to_a_gguf(mixed_gguf, capsys, flags, said):
    code = main(["parity", "--checkpoint", str(mixed_gguf), "--backend", "numpy", *flags])
    assert code == 2
    assert said in capsys.readouterr().err
