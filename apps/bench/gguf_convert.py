"""A checkpoint to GGUF with llama.cpp's own converter, for `fornax bench serve --peer llama.cpp`.

llama.cpp's `convert_hf_to_gguf.py` names a BPE tokenizer's pre-tokenizer (the GGUF key
`tokenizer.ggml.pre`) by hashing the ids its test string encodes to, and knows the hashes of
published tokenizers only: the generated checkpoints' own vocabulary is unknown to it, and it
stops with "BPE pre-tokenizer was not recognized". That tokenizer is byte-level BPE splitting
with the GPT-2 pattern (tokenizer.json: no normalizer, a `ByteLevel` pre-tokenizer with
`use_regex` and no prefix space), which is what llama.cpp calls `gpt-2`.

A checkpoint without a query LoRA (`q_lora_rank: null`, as DeepSeek-V2-Lite and the generated
presets have) gets no `deepseek2.attention.q_lora_rank` key from the converter, and llama.cpp's
loader tells such a model apart by its layer count (26 or 27: V2-Lite and its kin) and otherwise
requires the key ("key not found in model: deepseek2.attention.q_lora_rank"). The key with value
0 is what the loader reads as "no query LoRA" (it then takes the plain `attn_q` projection).

`convert` runs the converter of a llama.cpp source tree in this process and supplies `gpt-2` when,
and only when, the converter does not recognise the tokenizer and tokenizer.json declares exactly
that pre-tokenizer (any other tokenizer fails as the converter would), and writes
`q_lora_rank = 0` for a DeepSeek-V2 checkpoint whose config has none. The GGUF keeps the
tokenizer's ids, so llama.cpp and Fornax see the same prompts.
"""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CONVERTER = "convert_hf_to_gguf.py"
GPT2_PRE = "gpt-2"


class ConvertError(Exception):
    """The conversion cannot run or did not produce a GGUF; `reason` is a stable code."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def is_gpt2_byte_level(tokenizer: dict[str, Any]) -> bool:
    """Whether a tokenizer.json splits text exactly as GPT-2 does before BPE."""
    pre = tokenizer.get("pre_tokenizer") or {}
    model = tokenizer.get("model") or {}
    return (model.get("type") == "BPE" and tokenizer.get("normalizer") is None
            and pre.get("type") == "ByteLevel" and pre.get("use_regex") is True
            and pre.get("add_prefix_space") is False)


def converter_path(llama_cpp: Path) -> Path:
    path = llama_cpp / CONVERTER
    if not path.is_file():
        raise ConvertError("CONVERTER_MISSING", f"{path}: no llama.cpp converter there (the llama.cpp source tree, "
                                                "e.g. llama_cpp_python-X/vendor/llama.cpp)")
    return path


@contextmanager
def _supplemented_converter(llama_cpp: Path, checkpoint: Path) -> Iterator[None]:
    tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
    saved_path = list(sys.path)
    sys.path[:0] = [str(llama_cpp), str(llama_cpp / "gguf-py")]
    try:
        from conversion import base  # the converter's package, found in llama_cpp

        recognise = base.TextModel.get_vocab_base_pre

        def pre_tokenizer(model: Any, hf_tokenizer: Any) -> str:
            try:
                return recognise(model, hf_tokenizer)
            except NotImplementedError:
                if is_gpt2_byte_level(tokenizer):
                    return GPT2_PRE
                raise

        from conversion import deepseek

        parameters = deepseek.DeepseekV2Model.set_gguf_parameters

        def with_q_lora_rank(model: Any) -> None:
            parameters(model)
            if model.hparams.get("q_lora_rank") is None:
                model.gguf_writer.add_q_lora_rank(0)

        base.TextModel.get_vocab_base_pre = pre_tokenizer
        deepseek.DeepseekV2Model.set_gguf_parameters = with_q_lora_rank
        try:
            yield
        finally:
            base.TextModel.get_vocab_base_pre = recognise
            deepseek.DeepseekV2Model.set_gguf_parameters = parameters
    finally:
        sys.path[:] = saved_path


def convert(llama_cpp: Path, checkpoint: Path, outfile: Path, outtype: str = "f32") -> Path:
    """Runs the converter on `checkpoint`; the GGUF written, or ConvertError.

    The converter imports the tree's own `gguf-py` under the name `gguf`; a process that has
    already imported the installed `gguf` package (the weight codecs do) would hand it the wrong
    module, so the conversion runs in a child process of this interpreter.
    """
    converter_path(llama_cpp)
    if not (checkpoint / "config.json").is_file() or not (checkpoint / "tokenizer.json").is_file():
        raise ConvertError("CHECKPOINT_MISSING", f"{checkpoint}: no config.json and tokenizer.json there")
    child = subprocess.run([sys.executable, "-m", "apps.bench.gguf_convert", str(llama_cpp), str(checkpoint),
                            str(outfile), outtype], cwd=Path(__file__).resolve().parents[2], check=False)
    if child.returncode != 0:
        raise ConvertError("CONVERTER_FAILED", f"{CONVERTER} exited with {child.returncode}")
    return _check_written(outfile)


def convert_in_process(llama_cpp: Path, checkpoint: Path, outfile: Path, outtype: str = "f32") -> Path:
    """`convert` in this process (one that has not imported the installed `gguf`)."""
    script = converter_path(llama_cpp)
    argv = [str(script), str(checkpoint), "--outtype", outtype, "--outfile", str(outfile)]
    saved_argv = sys.argv
    sys.argv = argv
    try:
        with _supplemented_converter(llama_cpp, checkpoint):
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise ConvertError("CONVERTER_FAILED", f"{CONVERTER} exited with {exc.code}") from None
    except NotImplementedError as exc:
        raise ConvertError("CONVERTER_FAILED", f"{CONVERTER}: {exc}") from None
    finally:
        sys.argv = saved_argv
    return _check_written(outfile)


def _check_written(outfile: Path) -> Path:
    if not outfile.is_file():
        raise ConvertError("CONVERTER_FAILED", f"{outfile}: the converter wrote no file")
    with open(outfile, "rb") as handle:
        if handle.read(4) != b"GGUF":
            raise ConvertError("CONVERTER_FAILED", f"{outfile}: not a GGUF file after conversion")
    return outfile


if __name__ == "__main__":
    try:
        convert_in_process(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
    except ConvertError as exc:
        print(f"{exc.reason}: {exc}", file=sys.stderr)
        sys.exit(1)
