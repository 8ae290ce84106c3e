from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from libs.service.errors import InvalidArgument
from services.orchestrator.engine.domain import FinishReason
from services.orchestrator.python_api import Engine


def test_generate_is_str_to_str_and_stage_count_does_not_change_greedy_output(checkpoint):
    with Engine(checkpoint, stages=1) as one, Engine(checkpoint, stages=2) as two:
        a = one.generate_full("The experts", max_tokens=10)
        b = two.generate("The experts", max_tokens=10)
        chat = two.generate("hello", max_tokens=4, chat=True)
        with ThreadPoolExecutor(4) as pool:
            parallel = list(pool.map(lambda _: two.generate("The experts", max_tokens=10),
                                     range(4)))
        with pytest.raises(InvalidArgument) as info:
            two.generate("x", max_tokens=5000)
    assert isinstance(b, str) and isinstance(chat, str)
    assert a.text == b
    assert parallel == [b] * 4
    assert a.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    if a.finish_reason is FinishReason.LENGTH:
        assert a.completion_tokens == 10
    assert info.value.reason == "CONTEXT_LENGTH_EXCEEDED"


def test_seeded_sampling_is_reproducible(checkpoint):
    with Engine(checkpoint, stages=2) as engine:
        runs = [engine.generate("The experts", max_tokens=8, temperature=1.0, seed=7)
                for _ in range(2)]
        other = [engine.generate("The experts", max_tokens=8, temperature=1.0, seed=s)
                 for s in range(8, 12)]
    assert runs[0] == runs[1]
    assert any(o != runs[0] for o in other)
