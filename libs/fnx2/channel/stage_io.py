"""What a stage backend sees and returns, and how its output becomes a RESULT (pure)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from libs.fnx2.channel.session import BatchAdmission, Entry, Outcome
from libs.fnx2.wire.admission import AckAdmit, Admission
from libs.fnx2.wire.errors import ErrorCode
from libs.fnx2.wire.messages import Batch, Result, SequenceResult, SequenceSlice, Timings
from libs.fnx2.wire.tensor import Tensor, TensorDescriptor


@dataclass(frozen=True, slots=True)
class StageWork:
    """A validated BATCH as the backend sees it: only the sequences to execute."""

    batch: Batch
    sequences: tuple[SequenceSlice, ...]
    traceparent: str | None
    # Extensions negotiated on the channel this batch arrived on.
    extensions: frozenset[str] = frozenset()

    @property
    def inputs(self) -> np.ndarray:
        """The whole input tensor (storage dtype; bf16 as uint16 bits), read-only."""
        return self.batch.tensor.array

    def rows(self, item: SequenceSlice) -> np.ndarray:
        return self.batch.tensor.rows(item.input_row_start, item.input_row_count)


@dataclass(frozen=True, slots=True)
class SequenceFailure:
    request_id: str
    code: str  # an ErrorCode, or a later stage's code relayed as it was sent
    message: str


@dataclass(frozen=True, slots=True)
class StageOutput:
    """Output rows of the executed sequences that did not fail, in `StageWork` order."""

    tensor: Tensor | None
    failures: tuple[SequenceFailure, ...] = ()
    # Output rows per ok sequence, in order; None = as many as it sent. Fewer rows need the
    # compact_output extension on the channel.
    rows_per_sequence: tuple[int, ...] | None = None


class StageHandler(Protocol):
    async def execute(self, work: StageWork) -> StageOutput: ...

    def forget(self, request_id: str, execution_lease_id: str) -> None:
        """Drop this request's KV: it was released or expired."""


@runtime_checkable
class LeaseHandler(Protocol):
    """A handler that also opens, cancels and releases leases in band (the negotiated
    `inband_admission` extension): each applies it on its stage and forwards it to the next
    hop, and answers with every stage's outcome, its own first."""

    async def admit(self, admission: Admission) -> AckAdmit: ...

    async def cancel(self, request_id: str, execution_lease_id: str) -> tuple[int, ...]:
        """Each stage's KV epoch after the cancel."""
        ...

    async def release(self, request_id: str, execution_lease_id: str,
                      publish_token_ids: tuple[int, ...] = ()) -> tuple[int, ...]:
        """Frees the request's KV on each stage (publishing its full blocks first when
        `publish_token_ids` are given); each stage's final KV epoch."""
        ...


def outcomes(work: StageWork, output: StageOutput,
              compact_output: bool = False) -> dict[tuple[str, str], Outcome]:
    failed = {f.request_id: f for f in output.failures}
    outcomes: dict[tuple[str, str], Outcome] = {}
    counts = iter(output.rows_per_sequence or ())
    cursor = 0
    rows_available = 0 if output.tensor is None else output.tensor.descriptor.rows
    kind = None if output.tensor is None else (output.tensor.descriptor.kind,
                                               output.tensor.descriptor.dtype)
    array = None if output.tensor is None else output.tensor.array
    for item in work.sequences:
        identity = (item.request_id, item.execution_lease_id)
        failure = failed.get(item.request_id) if failed else None
        if failure is not None:
            outcomes[identity] = Outcome(False, None, failure.code, failure.message)
            continue
        rows = item.input_row_count if output.rows_per_sequence is None else next(counts, 0)
        if rows != item.input_row_count and not compact_output:
            outcomes[identity] = Outcome(False, None, ErrorCode.FAILED,
                                         "compact output needs the compact_output extension")
            continue
        if rows < 1 or cursor + rows > rows_available or array is None:
            outcomes[identity] = Outcome(False, None, ErrorCode.FAILED, "backend returned too few rows")
            continue
        outcomes[identity] = Outcome(True, array[cursor:cursor + rows], None, None, kind)
        cursor += rows
    return outcomes


def assemble(admission: BatchAdmission, entries: list[Entry], clock: Callable[[], int],
              timings: Timings) -> Result:
    """Compact ok rows in request-identity order; replayed results are remapped to this batch."""
    started = clock()
    parts = [entry.rows for entry in entries if entry.rows is not None]
    tensor = None
    if parts:
        kind = next(entry.kind for entry in entries if entry.rows is not None and entry.kind is not None)
        array = parts[0] if len(parts) == 1 else np.concatenate(parts)
        tensor = Tensor(TensorDescriptor(kind[0], kind[1], tuple(array.shape)), array)
    if timings.execute_ns:
        timings = Timings(timings.queue_ns, timings.execute_ns, clock() - started,
                          timings.unpack_ns)
    starts = {(s.request_id, s.execution_lease_id): s.input_row_start
              for s in admission.batch.batch.sequences}
    results: list[SequenceResult] = []
    cursor = 0
    for result, rows, _kind in entries:
        output_start = None
        if rows is not None:
            output_start = cursor
            cursor += result.output_row_count
        # The result placed in this batch's rows (a replayed one came from another batch).
        results.append(SequenceResult(
            result.request_id, result.execution_lease_id, result.request_sequence_no,
            result.status, starts[result.request_id, result.execution_lease_id],
            result.input_row_count, output_start, result.output_row_count, result.kv_epoch_before,
            result.kv_epoch_after, result.error_code, result.error_message, timings))
    return Result(admission.batch.batch.batch_id, admission.batch.batch.batch_sequence_no,
                  admission.batch.manifest_hash, tuple(results), tensor)
