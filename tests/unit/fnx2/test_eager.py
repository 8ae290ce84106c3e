"""start_eagerly: inline when a coroutine never waits, a task that carries on when it does."""

import asyncio
import contextvars

import pytest

from libs.fnx2.channel.eager import start_eagerly


async def _test_a_coroutine_that_never_waits_runs_inline_without_a_task():
    ran = []

    async def work():
        ran.append(asyncio.current_task())

    assert start_eagerly(work()) is None
    assert ran == [asyncio.current_task()]  # ran in the caller's turn, before any hop


async def _test_a_coroutine_that_waits_continues_as_a_task_with_its_results():
    gate, steps = asyncio.Event(), []

    async def work():
        steps.append("before")
        await gate.wait()
        await asyncio.sleep(0)
        steps.append("after")

    task = start_eagerly(work())
    assert steps == ["before"] and task is not None and not task.done()
    gate.set()
    await task
    assert steps == ["before", "after"]


async def _test_failures_and_cancellation_reach_the_coroutine():
    future = asyncio.get_running_loop().create_future()
    seen = []

    async def fails():
        await future
        raise ValueError("boom")

    task = start_eagerly(fails())
    future.set_result(None)
    with pytest.raises(ValueError):
        await task

    async def cancellable():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            seen.append("cleaned up")

    task = start_eagerly(cancellable())
    await asyncio.sleep(0)  # the task took its first step
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled", "cleaned up"]

    seen.clear()
    task = start_eagerly(cancellable())
    task.cancel()  # before the task's first step
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cleaned up"]


def test_a_coroutine_that_never_waits_runs_inline_without_a_task():
    asyncio.run(_test_a_coroutine_that_never_waits_runs_inline_without_a_task())


def test_a_coroutine_that_waits_continues_as_a_task_with_its_results():
    asyncio.run(_test_a_coroutine_that_waits_continues_as_a_task_with_its_results())


def test_failures_and_cancellation_reach_the_coroutine():
    asyncio.run(_test_failures_and_cancellation_reach_the_coroutine())


_CURRENT: contextvars.ContextVar[str] = contextvars.ContextVar("current", default="caller's")


async def _test_a_context_variable_set_before_waiting_is_reset_after_it_in_its_own_context():
    gate, seen = asyncio.Event(), []

    async def work():
        token = _CURRENT.set("work's")  # e.g. a span made current before the first wait
        await gate.wait()
        seen.append(_CURRENT.get())
        _CURRENT.reset(token)  # ValueError if the task resumed in another context
        seen.append(_CURRENT.get())

    task = start_eagerly(work())
    assert _CURRENT.get() == "caller's"  # nothing leaked into the caller's context
    gate.set()
    await task
    assert seen == ["work's", "caller's"]


def test_a_context_variable_set_before_waiting_is_reset_after_it_in_its_own_context():
    asyncio.run(_test_a_context_variable_set_before_waiting_is_reset_after_it_in_its_own_context())
