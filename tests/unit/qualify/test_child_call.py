"""`call_in_child`: the call runs in another process, which has exited when it returns; its
exceptions come back with their type and reason code."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from apps.qualify.child_call import ChildCallFailed, call_in_child
from libs.service.errors import FailedPrecondition


def _pid_and_sum(a: int, b: int = 0) -> tuple[int, int]:
    return os.getpid(), a + b


def _refuse(reason: str) -> None:
    raise FailedPrecondition("the stage cannot run here", reason=reason)


def test_the_call_runs_in_a_child_that_has_exited_when_it_returns():
    pid, total = call_in_child(_pid_and_sum, 2, b=3)
    assert total == 5
    assert pid != os.getpid()
    assert multiprocessing.active_children() == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_childs_exception_comes_back_with_its_type_and_reason():
    with pytest.raises(ChildCallFailed) as failed:
        call_in_child(_refuse, "BACKEND_UNAVAILABLE")
    assert failed.value.reason == "BACKEND_UNAVAILABLE"
    assert str(failed.value).startswith("FailedPrecondition: ") and "cannot run here" in str(failed.value)
