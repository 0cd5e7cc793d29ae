"""Staged parts: the embedded rows of a shard update, written by the stage that embedded them and
read back by the task that writes the update's shard files.

A part is an Arrow IPC file of ``embedded_part`` rows of one update, under the update's staging
folder (``staging_folder``: ``<gallery>/staging/<step>/<attempt token>/``). Its name is the hash of
the (id, row) pairs it holds, so a retried write of the same rows writes the same file again,
never a second copy; an attempt's token keeps the parts of different attempts apart. Nothing
served ever points at a staging folder: the lineage commit of the update's shard files is what
serves, after which the folder is removed; ``gc`` removes what a killed run left and ``verify``
lists it as unreferenced.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from orchestrator.storage import join_uri, read_bytes, write_bytes_atomic

STAGING_FOLDER = "staging"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def step_staging(gallery_root: str, step_key: str) -> str:
    """The folder of every part that step ``step_key`` staged, all attempts (the key's ``:`` and
    ``/`` become ``_``, so the folder stays one level under the staging root)."""
    return join_uri(gallery_root, STAGING_FOLDER, _UNSAFE.sub("_", step_key))


def staging_folder(gallery_root: str, step_key: str, attempt_token: str) -> str:
    """The folder of the parts that attempt ``attempt_token`` of step ``step_key`` stages."""
    return join_uri(step_staging(gallery_root, step_key), _UNSAFE.sub("_", attempt_token))


def write_parts(table: pa.Table, folders: Mapping[int, str],
                storage_options: Mapping[str, Any] | None = None) -> pa.Table:
    """Write the rows of ``table`` (``embedded_part`` columns with ``entry``) as one part per entry
    into that entry's folder (``folders[entry]``); returns one row per part written: ``entry``
    (int64), ``uri`` (string), ``n_items`` (int64). Only these rows travel on."""
    entries = table.column("entry").to_numpy()
    written: dict[str, list] = {"entry": [], "uri": [], "n_items": []}
    for entry in np.unique(entries):
        part = table.filter(pa.array(entries == entry)).drop_columns(["entry"])
        data = _ipc_bytes(part)
        uri = join_uri(folders[int(entry)], f"{_rows_digest(part)}.arrow")
        # not fsynced: only this attempt of the step reads its parts (a re-run stages a new attempt)
        write_bytes_atomic(uri, data, storage_options, durable=False)
        written["entry"].append(int(entry))
        written["uri"].append(uri)
        written["n_items"].append(len(part))
    return pa.table({"entry": pa.array(written["entry"], pa.int64()), "uri": pa.array(written["uri"], pa.string()),
                     "n_items": pa.array(written["n_items"], pa.int64())})


def read_parts(uris: Sequence[str], storage_options: Mapping[str, Any] | None = None) -> list[pa.Table]:
    """The parts at ``uris`` as ``embedded_part`` tables."""
    return [pa.ipc.open_stream(read_bytes(uri, storage_options)).read_all() for uri in uris]


def _ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _rows_digest(part: pa.Table) -> str:
    """20 hex characters naming the (id, row) pairs of ``part``, in its order."""
    pairs = np.stack([part.column("id").to_numpy().astype(np.int64), part.column("row").to_numpy().astype(np.int64)])
    return hashlib.sha256(np.ascontiguousarray(pairs).tobytes()).hexdigest()[:20]
