"""The sequence-table rules of BATCH and RESULT, one validator for both metadata encodings.

A BATCH's slices and a RESULT's sequence results obey the same rules whether the metadata is
canonical JSON or `compact_meta`. Both decoders (and both encoders, which never emit what
their decoder refuses) check them here, column by column: compact metadata passes the
columns of its one `struct.iter_unpack`, JSON the columns of its typed records. Each rule is
one min/max/accumulate/set over a column, never a Python object per field, and the codes are
the 2.0 ones: BATCH_CONTRACT for slices, BATCH_RESULT for results. Pure.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence

from libs.fnx2.wire.errors import ErrorCode, Fnx2Error
from libs.fnx2.wire.messages import Phase, SequenceResult, SequenceSlice, SequenceStatus


def _batch_contract(why: str) -> Fnx2Error:
    return Fnx2Error(ErrorCode.BATCH_CONTRACT, why)


def _batch_result(why: str) -> Fnx2Error:
    return Fnx2Error(ErrorCode.BATCH_RESULT, why)


def check_slice_columns(starts: Sequence[int], counts: Sequence[int], request_ids: Sequence[Hashable],
                        phase: Phase, input_rows: int) -> None:
    """Slices cover every input row once, in order; a decode slice is one row; each request
    appears once. `request_ids` may be in any one spelling (16 raw bytes or text)."""
    if not counts:
        raise _batch_contract("batch has no sequences")
    if min(counts) < 1:
        raise _batch_contract("input_row_count must be at least 1")
    if phase is Phase.DECODE and max(counts) != 1:
        raise _batch_contract("a decode slice is exactly one row")
    ends = list(itertools.accumulate(counts))
    if starts[0] != 0 or list(starts[1:]) != ends[:-1]:
        raise _batch_contract("slices must cover input rows in order without gaps or overlap")
    if ends[-1] != input_rows:
        raise _batch_contract("slices must cover every input row exactly once")
    if len(set(request_ids)) != len(request_ids):
        raise _batch_contract("batch names a request more than once")


def check_result_columns(ok: Sequence[bool], input_rows: Sequence[int], has_output: Sequence[int],
                         output_rows: Sequence[int], has_error: Sequence[int],
                         epochs_before: Sequence[int], epochs_after: Sequence[int]) -> None:
    """Each sequence result's own rules: an ok one has output rows and no error; any other
    has an error, no output rows and an unchanged KV epoch; no epoch moves backwards.
    `has_output` and `has_error` are truthy per sequence (flags or lengths)."""
    if min(input_rows) < 1:
        raise _batch_result("input_row_count must be at least 1")
    if any(map(int.__lt__, epochs_after, epochs_before)):
        raise _batch_result("KV epoch cannot move backwards")
    for good, output, rows, error, before, after in zip(ok, has_output, output_rows, has_error,
                                                        epochs_before, epochs_after, strict=True):
        if good:
            if not output or not rows or error:
                raise _batch_result("an ok sequence has output rows and no error")
        elif output or rows or not error or after != before:
            raise _batch_result("a failed sequence has an error, no output rows and unchanged KV")


def check_slices(phase: Phase, input_rows: int, slices: Sequence[SequenceSlice]) -> None:
    """`check_slice_columns` over typed slices (the JSON form, and every encoder)."""
    check_slice_columns([s.input_row_start for s in slices], [s.input_row_count for s in slices],
                        [s.request_id for s in slices], phase, input_rows)


def check_results(results: Sequence[SequenceResult]) -> None:
    """`check_result_columns` over typed results (the JSON form, and every encoder)."""
    if not results:
        return  # an empty RESULT is refused by `Result.check`
    check_result_columns(
        [r.status is SequenceStatus.OK for r in results], [r.input_row_count for r in results],
        [r.output_row_start is not None for r in results], [r.output_row_count for r in results],
        [r.error_code is not None for r in results], [r.kv_epoch_before for r in results],
        [r.kv_epoch_after for r in results])
