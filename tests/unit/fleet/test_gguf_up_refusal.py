"""`fornax up --checkpoint FILE.gguf` serves numpy stages in the file's own formats: a weight policy
or a MAX backend beside a GGUF is refused before anything starts."""

from __future__ import annotations

import pytest

from apps.cli.main import main


@pytest.mark.parametrize("flags, said", [
    (["--weights", "q4_k_m"], "drop --weights"),
    (["--backend", "max"], "--backend numpy"),
])
def test_up_refuses_what_a_gguf_cannot_be_served_with(tmp_path, capsys, flags, said):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    code = main(["up", "--checkpoint", str(gguf), *flags, "--state-dir", str(tmp_path / ".fornax")])
    assert code == 2
    err = capsys.readouterr().err
    assert "is a GGUF" in err and said in err
    assert not (tmp_path / ".fornax" / "fleet.json").exists()
