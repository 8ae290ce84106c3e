"""A weight held in its stored format; float32 only while a product uses it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from libs.weights.codecs import decode, stored_shape
from libs.weights.formats import WeightFormat


@dataclass(frozen=True, eq=False)
class PackedWeight:
    fmt: WeightFormat
    shape: tuple[int, ...]   # the logical (Hugging Face) shape
    data: np.ndarray         # the stored array, often a copy-on-write map of the artifact file (never written)

    def __post_init__(self) -> None:
        if tuple(self.data.shape) != stored_shape(self.fmt, self.shape):
            raise ValueError(f"{self.fmt.name} data of shape {self.data.shape} cannot hold {self.shape}")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def dense(self) -> np.ndarray:
        """A float32 copy of the logical tensor (the caller drops it after use)."""
        return np.asarray(decode(self.data, self.fmt), dtype=np.float32).reshape(self.shape)

    def rows(self, index: np.ndarray) -> np.ndarray:
        """float32 rows of a 2-D weight (an embedding lookup), decoding only those rows."""
        return np.asarray(decode(self.data[index], self.fmt), dtype=np.float32).reshape(len(index), self.shape[-1])

    def __getitem__(self, index: int) -> PackedWeight:
        """One slice along the first axis (an expert of a stacked 3-D tensor), still packed."""
        return PackedWeight(self.fmt, self.shape[1:], self.data[index])


Weight = np.ndarray | PackedWeight


def dense(w: Weight) -> np.ndarray:
    return w.dense() if isinstance(w, PackedWeight) else w


def rows_of(w: Weight, index: np.ndarray) -> np.ndarray:
    return w.rows(index) if isinstance(w, PackedWeight) else w[index]
