"""The hand-written safetensors header reader/writer against the reference implementation."""

from __future__ import annotations

import io

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from libs.artifacts.errors import SafetensorsHeaderError, SafetensorsTruncatedError
from libs.artifacts.safetensors_format import (
    PlannedTensor,
    copy_range,
    encode_header,
    layout_tensors,
    read_header,
)


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "b.weight": rng.standard_normal((3, 5)).astype(np.float32),
        "a.weight": rng.standard_normal((7,)).astype(np.float16),
        "c.ids": np.arange(6, dtype=np.int32).reshape(2, 3),
    }


def test_reader_agrees_with_reference_writer(tmp_path):
    path = tmp_path / "x.safetensors"
    arrays = _arrays()
    save_file(arrays, str(path))
    header = read_header(path)
    with safe_open(str(path), framework="np") as handle:
        assert sorted(handle.keys()) == sorted(t.name for t in header.tensors)
    raw = path.read_bytes()
    for entry in header.tensors:
        start = header.data_start + entry.data_begin
        chunk = raw[start : start + entry.nbytes]
        expected = arrays[entry.name]
        assert entry.shape == expected.shape
        assert chunk == expected.tobytes()


def test_writer_output_loads_with_reference_reader(tmp_path):
    arrays = _arrays()
    dtypes = {np.float32: "F32", np.float16: "F16", np.int32: "I32"}
    planned = [PlannedTensor(n, dtypes[a.dtype.type], a.shape) for n, a in sorted(arrays.items())]
    entries = layout_tensors(planned)
    path = tmp_path / "y.safetensors"
    with open(path, "wb") as fh:
        header = encode_header(entries, {"format": "pt"})
        assert (len(header) - 8) % 8 == 0
        fh.write(header)
        for entry in entries:
            fh.write(arrays[entry.name].tobytes())
    loaded = load_file(str(path))
    assert sorted(loaded) == sorted(arrays)
    for name, array in arrays.items():
        np.testing.assert_array_equal(loaded[name], array)


def test_truncated_file_is_reported_as_truncation(tmp_path):
    path = tmp_path / "t.safetensors"
    save_file(_arrays(), str(path))
    data = path.read_bytes()
    path.write_bytes(data[:-3])
    with pytest.raises(SafetensorsTruncatedError):
        read_header(path)
    path.write_bytes(data[:5])
    with pytest.raises(SafetensorsTruncatedError):
        read_header(path)


def test_garbage_header_and_trailing_bytes_are_rejected(tmp_path):
    path = tmp_path / "g.safetensors"
    path.write_bytes((4).to_bytes(8, "little") + b"nope")
    with pytest.raises(SafetensorsHeaderError):
        read_header(path)
    save_file(_arrays(), str(path))
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(SafetensorsHeaderError):
        read_header(path)


def test_header_with_wrong_extent_is_rejected(tmp_path):
    body = b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}'
    path = tmp_path / "e.safetensors"
    path.write_bytes(len(body).to_bytes(8, "little") + body + b"\0" * 4)
    with pytest.raises(SafetensorsHeaderError, match="needs 8"):
        read_header(path)


def test_copy_range_streams_in_bounded_chunks():
    src = io.BytesIO(bytes(range(256)) * 4)
    dst = io.BytesIO()
    seen: list[int] = []
    copy_range(src, dst, offset=10, nbytes=100, chunk_bytes=7, sink=lambda c: seen.append(len(c)))
    assert dst.getvalue() == (bytes(range(256)) * 4)[10:110]
    assert max(seen) == 7 and sum(seen) == 100
    with pytest.raises(SafetensorsTruncatedError):
        copy_range(src, io.BytesIO(), offset=1000, nbytes=100, chunk_bytes=7)
