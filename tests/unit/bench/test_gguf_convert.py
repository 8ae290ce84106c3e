"""`fornax bench gguf`: which tokenizers may be named `gpt-2` for llama.cpp's converter, and the
refusals before the converter runs. (The conversion itself needs a llama.cpp source tree:
tests/integration/bench/test_gguf_convert_real.py.)"""

from __future__ import annotations

import copy
import json

import pytest
import regex
from tokenizers import Tokenizer

from apps.bench.gguf_convert import ConvertError, convert, is_gpt2_byte_level
from apps.cli.main import main
from libs.model.tokenizer_build import checkpoint_tokenizer_json

# GPT-2's split pattern, as llama.cpp's `gpt-2` pre-tokenizer has it (llama-vocab.cpp); its
# splitter keeps the text between matches as pieces of their own, which `|\s+` reproduces here.
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# The converter's own probe text (convert_hf_to_gguf.py, get_vocab_base_pre), abridged.
PROBE = ("\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ ✅ 🦙🦙 3 33 333 3333 3.3 3..3 "
         "កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български "
         "''''''```````\"\"\"\"......!!!!!!?????? "
         "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL")


@pytest.fixture(scope="module")
def generated_tokenizer() -> dict:
    return json.loads(checkpoint_tokenizer_json(16384))


def test_the_generated_checkpoints_tokenizer_is_gpt2_byte_level(generated_tokenizer):
    assert is_gpt2_byte_level(generated_tokenizer)


def test_it_splits_text_where_gpt2s_pattern_does(generated_tokenizer):
    tokenizer = Tokenizer.from_str(json.dumps(generated_tokenizer))
    ours = [span for _, span in tokenizer.pre_tokenizer.pre_tokenize_str(PROBE)]
    gpt2 = [m.span() for m in regex.finditer(GPT2_SPLIT + r"|\s+", PROBE)]
    assert ours == gpt2


@pytest.mark.parametrize("change", [
    lambda t: t["pre_tokenizer"].update(use_regex=False),
    lambda t: t["pre_tokenizer"].update(add_prefix_space=True),
    lambda t: t.update(pre_tokenizer={"type": "Metaspace"}),
    lambda t: t.update(normalizer={"type": "NFC"}),
    lambda t: t["model"].update(type="Unigram"),
])
def test_any_other_pre_tokenization_is_not_named_gpt2(generated_tokenizer, change):
    changed = copy.deepcopy(generated_tokenizer)
    change(changed)
    assert not is_gpt2_byte_level(changed)


def test_a_tree_without_the_converter_is_refused(tmp_path):
    with pytest.raises(ConvertError) as caught:
        convert(tmp_path, tmp_path, tmp_path / "out.gguf")
    assert caught.value.reason == "CONVERTER_MISSING"


def test_a_directory_without_a_checkpoint_is_refused(tmp_path):
    (tmp_path / "convert_hf_to_gguf.py").write_text("raise SystemExit('must not run')\n")
    with pytest.raises(ConvertError) as caught:
        convert(tmp_path, tmp_path / "absent", tmp_path / "out.gguf")
    assert caught.value.reason == "CHECKPOINT_MISSING"


def test_the_cli_exits_2_with_the_reason(tmp_path, capsys):
    assert main(["bench", "gguf", "--llama-cpp", str(tmp_path), "--checkpoint", str(tmp_path),
                 "--outfile", str(tmp_path / "x.gguf")]) == 2
    assert "CONVERTER_MISSING" in capsys.readouterr().err
