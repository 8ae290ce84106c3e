"""Stage weights are mapped copy-on-write (never written, never copied), and an expert's gate
and up rows that lie back to back in the file are joined by one map instead of a copy."""

from __future__ import annotations

import numpy as np
import pytest

from libs.model.safetensors_io import SafetensorsWriter, file_offset, joined_rows, map_tensor, read_header


def _write(path, tensors: dict[str, np.ndarray]):
    writer = SafetensorsWriter(path, [(n, "U8", a.shape) for n, a in tensors.items()], {})
    for name, array in tensors.items():
        writer.write(name, array)
    writer.close()
    entries, data_start = read_header(path)
    return lambda name: map_tensor(path, name, entries, data_start)


@pytest.fixture
def rows(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"a.down": rng.integers(0, 255, (3, 24), np.uint8), "a.gate": rng.integers(0, 255, (5, 24), np.uint8),
               "a.up": rng.integers(0, 255, (5, 24), np.uint8), "b.gate": rng.integers(0, 255, (5, 16), np.uint8)}
    return tmp_path / "s.safetensors", tensors, _write(tmp_path / "s.safetensors", tensors)


def test_a_mapped_tensor_is_writable_but_never_writes_its_file(rows):
    path, tensors, mapped = rows
    before = path.read_bytes()
    gate = mapped("a.gate")
    assert gate.flags.writeable  # a runtime aliases a writable array; a read-only one it copies
    gate[0, 0] ^= 0xFF
    del gate
    assert path.read_bytes() == before
    np.testing.assert_array_equal(mapped("a.gate"), tensors["a.gate"])


def test_adjacent_gate_and_up_rows_are_joined_by_one_map(rows):
    _, tensors, mapped = rows
    joined = joined_rows(mapped("a.gate"), mapped("a.up"))
    assert isinstance(joined, np.memmap) and joined.flags.writeable
    np.testing.assert_array_equal(joined, np.concatenate([tensors["a.gate"], tensors["a.up"]]))


def test_rows_that_are_not_back_to_back_are_not_joined(rows):
    _, _, mapped = rows
    assert joined_rows(mapped("a.up"), mapped("a.gate")) is None  # wrong order
    assert joined_rows(mapped("a.down"), mapped("a.up")) is None  # a gap (the gate) between them
    assert joined_rows(mapped("a.up"), mapped("b.gate")) is None  # another row width
    assert joined_rows(np.asarray(mapped("a.gate")).copy(), mapped("a.up")) is None  # not a map


def test_maps_of_another_file_are_not_joined(rows, tmp_path):
    _, tensors, mapped = rows
    other = _write(tmp_path / "t.safetensors", tensors)
    assert joined_rows(mapped("a.gate"), other("a.up")) is None


def test_a_slice_of_a_map_is_located_by_its_own_first_byte(rows):
    path, tensors, mapped = rows
    gate, up = mapped("a.gate"), mapped("a.up")
    assert file_offset(gate[2:]) == file_offset(gate) + 2 * 24
    assert joined_rows(gate[:4], up) is None  # the last gate row lies between them
    np.testing.assert_array_equal(joined_rows(gate[2:], up), np.concatenate([tensors["a.gate"][2:], tensors["a.up"]]))
