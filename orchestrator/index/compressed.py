"""What the compressed indexes (``BinaryIndex``, ``PQIndex``) share with ``ShardIndex``'s interface.

* ``search(queries (Q, D), k) -> (distances (Q, k) float64, ids (Q, k) int64)``, sorted ascending,
  missing slots id ``-1`` / distance ``+inf`` at the end of a row;
* item ids: FAISS searches by POSITION (0..N-1, the order the gallery was added in) and ``ids``
  ``(N,)`` int64 maps a position to its item id. ``ids`` is ``None`` when FAISS's labels already are
  the item ids: the default ids ``0..N-1`` (nothing stored, like a bare FAISS index) or an IVF
  index, whose inverted lists store the item ids themselves. This is ``IndexBinaryIDMap``'s job done
  with a plain array: the two-stage re-rank needs the positions (to find stored codes / vectors),
  and the array costs 8 bytes per item without ``IndexIDMap2``'s hash map;
* serialisation through ``container`` (pickle-free; magic ``ORCHCMP1``, JSON header, checksummed
  sections), ``save`` / ``load`` through the storage layer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Mapping

import numpy as np

from orchestrator.geometry.geometry import Geometry
from orchestrator.geometry.spaces import Space
from orchestrator.index import container
from orchestrator.index.shard_index import _as_matrix, _check_curv, _check_ids, _check_positive_int
from orchestrator.storage.filesystem import read_bytes, redact_uri, write_bytes_atomic


def position_ids(ids: Any, n: int) -> np.ndarray | None:
    """Validated item ids ``(n,)`` int64, or ``None`` when they are the positions ``0..n-1``."""
    item_ids = _check_ids(ids, n)
    return None if np.array_equal(item_ids, np.arange(n)) else item_ids


class CompressedIndex(ABC):
    """Base of the compressed indexes: query checks, top-k assembly, header and serialisation.

    ``dim`` is the number of columns of the embeddings and queries (``d+1`` for lorentz); ``curv``
    is used by the hyperbolic spaces only. Subclasses set ``KINDS`` and implement ``ntotal``,
    ``code_bytes``, ``memory_bytes``, ``search``, ``_params``, ``_sections`` and ``_from_parts``.
    """

    KINDS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, kind: str, space: Space, curv: float, dim: int, ids: np.ndarray | None) -> None:
        if kind not in self.KINDS:
            raise ValueError(f"kind must be one of {list(self.KINDS)}, got {kind!r}")
        self.kind = kind
        self.space = Space.parse(space)
        self.curv = _check_curv(curv)
        self.dim = _check_positive_int(dim, "dim")
        self.ids = ids

    @property
    def geometry(self) -> Geometry:
        """The index's space and curvature: its coordinates (Poincaré ball for both hyperbolic spaces)."""
        return Geometry(self.space, self.curv)

    # -- interface of the subclasses -------------------------------------------------------------
    @property
    @abstractmethod
    def ntotal(self) -> int:
        """Number of items in the index."""

    @property
    @abstractmethod
    def code_bytes(self) -> int:
        """Bytes of the code FAISS stores per item (the paper's memory: ``N × code_bytes``)."""

    @property
    @abstractmethod
    def memory_bytes(self) -> int:
        """Bytes of everything a search reads: codes, item ids, trained parameters, stored vectors."""

    @abstractmethod
    def search(self, queries: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(Q, D)`` queries → ``(distances (Q, k) float64, ids (Q, k) int64)`` (module docstring)."""

    @abstractmethod
    def _params(self) -> dict[str, Any]:
        """The subclass's fields of the JSON header."""

    @abstractmethod
    def _sections(self) -> dict[str, bytes]:
        """The subclass's binary sections (FAISS bytes, stored vectors)."""

    @classmethod
    @abstractmethod
    def _from_parts(cls, common: dict[str, Any], header: dict[str, Any], sections: dict[str, bytes]) -> CompressedIndex:
        """The index from the common fields (``kind, space, curv, dim, ids``), header and sections."""

    # -- shared search steps ---------------------------------------------------------------------
    def _ids_bytes(self) -> int:
        return 0 if self.ids is None else self.ids.nbytes

    def _query_coordinates(self, queries: Any, k: Any) -> tuple[np.ndarray, int]:
        """Checked ``(Q, D)`` queries → their float64 ``(Q, d)`` coordinates, and the checked ``k``."""
        queries = _as_matrix(queries, "queries")
        if queries.shape[1] != self.dim:
            raise ValueError(
                f"queries must have dimension {self.dim} (this {self.space.value} index's dim), got {queries.shape[1]}"
            )
        return self.geometry.coordinates(queries), _check_positive_int(k, "k")

    @staticmethod
    def _missing(n_queries: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        return np.full((n_queries, k), np.inf), np.full((n_queries, k), -1, dtype=np.int64)

    def _top_k(self, distances: np.ndarray, labels: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` smallest of ``distances (Q, F)`` per row (stable), ``labels`` mapped to item ids;
        ``labels < 0`` are missing (distance ``+inf``, id ``-1``). Pads to ``k`` columns if ``F < k``."""
        labels = np.asarray(labels, dtype=np.int64)
        distances = np.where(labels >= 0, distances, np.inf)
        order = np.argsort(distances, axis=1, kind="stable")[:, :k]
        distances = np.take_along_axis(distances, order, axis=1)
        labels = np.take_along_axis(labels, order, axis=1)
        if self.ids is not None:
            labels = np.where(labels >= 0, self.ids[np.maximum(labels, 0)], -1)
        if labels.shape[1] < k:
            pad_d, pad_i = self._missing(len(labels), k - labels.shape[1])
            distances, labels = np.hstack([distances, pad_d]), np.hstack([labels, pad_i])
        return distances, labels

    # -- serialisation ---------------------------------------------------------------------------
    def header(self) -> dict[str, Any]:
        """The JSON header written by ``to_bytes`` (without the section table)."""
        return {"kind": self.kind, "space": self.space.value, "curv": self.curv, "dim": self.dim,
                "ntotal": self.ntotal, "has_ids": self.ids is not None, **self._params()}

    def to_bytes(self) -> bytes:
        """``container.pack`` of the header and the sections (FAISS bytes, item ids, vectors)."""
        sections = self._sections()
        if self.ids is not None:
            sections["ids"] = self.ids.astype("<i8").tobytes()
        return container.pack(self.header(), sections)

    @classmethod
    def from_bytes(cls, data: bytes) -> CompressedIndex:
        """Inverse of ``to_bytes``; ValueError for anything that is not an intact index of this class."""
        header, sections = container.unpack(data)
        return cls.from_parts(header, sections)

    @classmethod
    def from_parts(cls, header: dict[str, Any], sections: dict[str, bytes]) -> CompressedIndex:
        """An index from ``container.unpack``'s output (the loader dispatches here on ``kind``)."""
        if header.get("kind") not in cls.KINDS:
            raise ValueError(f"kind must be one of {list(cls.KINDS)} for {cls.__name__}, got {header.get('kind')!r}")
        try:
            ids = None
            if header["has_ids"]:
                ids = np.frombuffer(sections["ids"], dtype="<i8").astype(np.int64)
            common = {"kind": header["kind"], "space": Space.parse(header["space"]), "curv": header["curv"],
                      "dim": header["dim"], "ids": ids}
            index = cls._from_parts(common, header, sections)
        except (KeyError, TypeError, RuntimeError) as exc:
            raise ValueError(f"data has an invalid {cls.__name__} header or payload: {exc!r}") from None
        if index.ntotal != header.get("ntotal") or (ids is not None and len(ids) != index.ntotal):
            raise ValueError(f"header says ntotal={header.get('ntotal')}, index holds {index.ntotal}")
        return index

    def save(self, uri: str, storage_options: Mapping[str, Any] | None = None) -> None:
        """Write ``to_bytes()`` to ``uri`` atomically (local path, ``file://``, ``s3://`` ...)."""
        write_bytes_atomic(uri, self.to_bytes(), storage_options)

    @classmethod
    def load(cls, uri: str, storage_options: Mapping[str, Any] | None = None) -> CompressedIndex:
        """Read an index written by ``save``; FileNotFoundError if absent, ValueError if corrupt."""
        data = read_bytes(uri, storage_options)
        try:
            return cls.from_bytes(data)
        except ValueError as exc:
            raise ValueError(f"{redact_uri(uri)}: {exc}") from None
