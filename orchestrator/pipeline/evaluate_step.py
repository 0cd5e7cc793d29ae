"""Each generation's embeddings of the evaluation split: computed once, stored, reused.

``evaluate:<gen>`` embeds the evaluation split (``evaluation.eval_sample`` of it) with ``<gen>``
only, writes the embeddings to ``<storage>/generations/<gen>/eval-<split>.safetensors`` (tensors
``embedding``, ``labels``, ``ids``; written atomically, safetensors, never pickle) and records the
file and its sha256 in the step's outputs (``EVAL_EMBEDDINGS``). Every earlier generation's
embeddings are read back from the files their own evaluate steps recorded (sha256 checked), so a
lineage of T generations embeds the split T times, not T(T+1)/2 times. The cells of ``<gen>``'s
row are computed from the stored embeddings (``orchestrator.evaluation.compare_generations``).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import safetensors.torch
from torch.utils.data import Dataset

from orchestrator.evaluation import CompatibilityReport, SplitEmbeddings, compare_generations, embed_split
from orchestrator.integrity import EVAL_EMBEDDINGS  # the key of the step's outputs (verify reads it too)
from orchestrator.models.bundle import CompatibleModel
from orchestrator.storage import ChecksumMismatch, join_uri, read_bytes, redact_uri, sha256_hex, write_bytes_atomic

_TENSORS = ("embedding", "labels", "ids")

def eval_embeddings_uri(storage: str, generation: str, split: str) -> str:
    """Where ``generation``'s embeddings of the evaluation split ``split`` are stored."""
    return join_uri(storage, "generations", generation, f"eval-{split}.safetensors")


def write_split_embeddings(uri: str, embedded: SplitEmbeddings) -> dict[str, Any]:
    """Write ``embedded`` to ``uri`` atomically; returns the record ``{"uri", "sha256", "items"}``."""
    data = safetensors.torch.save({name: getattr(embedded, name).contiguous() for name in _TENSORS})
    write_bytes_atomic(uri, data)
    return {"uri": uri, "sha256": sha256_hex(data), "items": int(embedded.embedding.shape[0])}


def read_split_embeddings(record: Mapping[str, Any]) -> SplitEmbeddings:
    """The embeddings of a record written by ``write_split_embeddings``: ``ChecksumMismatch``
    naming the file when its bytes changed, ValueError naming it when it lacks a tensor."""
    uri = record["uri"]
    data = read_bytes(uri)
    actual = sha256_hex(data)
    if actual != record["sha256"]:
        raise ChecksumMismatch(uri, record["sha256"], actual)
    tensors = safetensors.torch.load(data)
    missing = [name for name in _TENSORS if name not in tensors]
    if missing:
        raise ValueError(f"{redact_uri(uri)}: not an evaluation embeddings file (missing tensor(s) {', '.join(missing)})")
    return SplitEmbeddings(*(tensors[name] for name in _TENSORS))


def recorded_embeddings(outputs: Mapping[str, Any] | None, key: str) -> Mapping[str, Any]:
    """The embeddings record in the committed outputs of evaluate step ``key``; ValueError naming
    the step when it has not committed or recorded none (an evaluation from an older version)."""
    record = None if outputs is None else outputs.get(EVAL_EMBEDDINGS)
    if not isinstance(record, Mapping) or not {"uri", "sha256"} <= set(record):
        state = "has not committed" if outputs is None else "recorded no evaluation embeddings"
        raise ValueError(f"step {key!r} {state}; its generation's stored embeddings of the evaluation split "
                         "are needed by every later generation's evaluation")
    return record


def evaluate_once(name: str, models: Mapping[str, CompatibleModel], data: Dataset,
                  parents: Mapping[str, str], stored: Mapping[str, Mapping[str, Any]],
                  uri: str) -> tuple[CompatibilityReport, dict[str, Any]]:
    """``name``'s row of the compatibility matrices (queries of ``name`` against every generation
    of ``models`` up to it) and the record of its stored embeddings.

    models: the lineage up to ``name``, oldest first (spaces and adapters of the comparison paths).
    data:   the evaluation split as ``name`` embeds it (``embed_split``; the only forward pass here).
    stored: every earlier generation of ``models`` → its record (``recorded_embeddings``).
    uri:    where ``name``'s embeddings are written (``eval_embeddings_uri``).
    """
    embedded = {other: read_split_embeddings(stored[other]) for other in models if other != name}
    embedded[name] = embed_split(models[name], data)
    record = write_split_embeddings(uri, embedded[name])
    return compare_generations(models, embedded, parents, queries=[name]), record
