"""The hits' item attributes (``uri`` and the gallery's metadata columns) from columnar arrays.

A shard file holds its items' attributes as an Arrow table (``gallery.shard_files``). Looking a
hit up there row by row (``np.isin`` over the shard's ids, an Arrow ``take``, ``to_pydict``) costs
tens of microseconds per shard and per query, more than the search itself on small galleries.
``ItemColumns`` reads the table once, when a snapshot is built: the item ids sorted ascending,
(n,) int64, and each column as a Python list in that order; a lookup is one ``np.searchsorted`` of
the hit ids and a list index per hit and column.

``ItemColumns.rows(ids)``: per id (in the order given) a dict of its attributes, empty when the
shard holds no such item or recorded no attributes; ``subset(ids)``: the columns of only those
items (what a shard-search replica sends back with its hits, ``serving.shares``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ItemColumns:
    """Attribute columns of n items: ``ids`` (n,) int64 ascending and unique, ``columns`` column
    name → its n values in the order of ``ids``."""

    ids: np.ndarray
    columns: dict[str, list[Any]]

    @classmethod
    def of_attributes(cls, ids: np.ndarray, attributes: Any) -> ItemColumns:
        """The columns of n items: their ids (n,) and their attribute table (``pyarrow.Table`` of n
        rows, or None: no attributes recorded), as ``gallery.read_recorded_attributes`` reads them."""
        ids = np.asarray(ids, dtype=np.int64)
        if attributes is None:
            return cls(np.zeros(0, dtype=np.int64), {})
        order = np.argsort(ids, kind="stable")
        table = attributes.take(order)
        return cls(ids[order], {name: _python_values(table.column(name)) for name in table.column_names})

    @classmethod
    def joined(cls, parts: Sequence[ItemColumns]) -> ItemColumns:
        """The columns of several parts of one shard's items as one (an item in several parts once)."""
        if not parts:
            return cls(np.zeros(0, dtype=np.int64), {})
        ids, first = np.unique(np.concatenate([part.ids for part in parts]), return_index=True)
        columns = {}
        for name in parts[0].columns:
            values = [value for part in parts for value in part.columns[name]]
            columns[name] = [values[row] for row in first.tolist()]
        return cls(ids, columns)

    def _positions(self, ids: np.ndarray) -> tuple[list[int], list[bool]]:
        """(position in ``self.ids`` of each of ``ids``, whether it is held there)."""
        ids = np.asarray(ids, dtype=np.int64)
        positions = np.minimum(np.searchsorted(self.ids, ids), max(len(self.ids) - 1, 0))
        held = self.ids[positions] == ids if len(self.ids) else np.zeros(len(ids), dtype=bool)
        return positions.tolist(), held.tolist()

    def rows(self, ids: np.ndarray) -> list[dict[str, Any]]:
        """Per item of ``ids`` (k,), in that order, {column: value}; {} for an item not held."""
        if not self.columns:
            return [{} for _ in range(len(ids))]
        names, columns = list(self.columns), list(self.columns.values())
        positions, held = self._positions(ids)
        return [dict(zip(names, [column[p] for column in columns])) if h else {}
                for p, h in zip(positions, held)]

    def subset(self, ids: np.ndarray) -> ItemColumns:
        """The columns of those of ``ids`` (any order, repeats and −1 allowed) this holds."""
        wanted = np.unique(np.asarray(ids, dtype=np.int64))
        positions, held = self._positions(wanted)
        kept = [p for p, h in zip(positions, held) if h]
        return ItemColumns(self.ids[kept] if kept else np.zeros(0, dtype=np.int64),
                           {name: [values[p] for p in kept] for name, values in self.columns.items()})


#: Values converted to Python objects per call (``_python_values``).
CONVERSION_ROWS = 8192


def _python_values(column: Any) -> list[Any]:
    """An Arrow column's values as a Python list, ``CONVERSION_ROWS`` at a time: one conversion of
    a whole 250,000-row column holds the interpreter ~20 ms at once, stalling a server's searches
    while it builds a snapshot; between slices its other threads run."""
    values: list[Any] = []
    for start in range(0, len(column), CONVERSION_ROWS):
        values.extend(column.slice(start, CONVERSION_ROWS).to_pylist())
    return values
