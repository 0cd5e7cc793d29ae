"""The keys of the lineage's steps: one constructor per kind of step and one parser.

A pipeline step is recorded under a key (table ``steps``) that names what it did; the stored strings
are these (``<gen>``, ``<gallery>``: configured names, ``orchestrator.names``, so never ``:`` or ``/``):

=====================================  ==========================================================
``train:<gen>``                        train a generation (``train_key``)
``evaluate:<gen>``                     evaluate it against its parents (``evaluate_key``)
``plan:<gallery>:<gen>``               plan the gallery's update (``plan_key``)
``plan:<gallery>:<gen>:full``          the plan escalated to a full re-embedding (``plan_key(full=True)``)
``embed:<gallery>/<shard>:<gen>``      re-embed one shard in place (``shard_update_key``)
``split:<gallery>/<shard>:<gen>``      re-embed part of one shard into a new shard (``shard_update_key``)
``gallery-eval:<gallery>:<gen>``       evaluate the gallery as served after the update (``gallery_eval_key``)
``gate:<gallery>:<gen>``               the deployment gate's measurement (``gate_key``)
``deploy:<gen>``                       serve the generation (``deploy_key``)
``redeploy:<gen>:<n>``                 the n-th redeployment of an earlier generation (``redeploy_key``)
``integrity:<index uri>``              the hashes of one index file (``integrity_key``)
``source:<gallery>``                   the gallery's source snapshot (``source_key``)
``store:<gallery>:<store hash>``       a vector store the gallery writes to (``store_key``)
=====================================  ==========================================================

Existing lineages hold these strings: they stay byte-identical. Everything that builds a key calls a
constructor here; everything that reads one back calls ``parse_step_key`` (or matches a kind's
``prefix``, for a query over the ``steps`` table).
"""
from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

#: The suffix of an escalated plan's key.
_FULL = "full"


class StepKind(enum.Enum):
    """The kinds of step; the value is the key's first field."""

    TRAIN = "train"
    EVALUATE = "evaluate"
    PLAN = "plan"
    EMBED = "embed"
    SPLIT = "split"
    GALLERY_EVAL = "gallery-eval"
    GATE = "gate"
    DEPLOY = "deploy"
    REDEPLOY = "redeploy"
    INTEGRITY = "integrity"
    SOURCE = "source"
    STORE = "store"

    @property
    def prefix(self) -> str:
        """What every key of this kind starts with (``"train:"``)."""
        return f"{self.value}:"


@dataclass(frozen=True)
class StepKey:
    """A parsed step key: its kind and the fields its kind has (the others None)."""

    kind: StepKind
    generation: str | None = None
    gallery: str | None = None
    shard: int | None = None
    number: int | None = None
    full: bool = False
    location: str | None = None
    store: str | None = None


def train_key(generation: str) -> str:
    return f"{StepKind.TRAIN.prefix}{generation}"


def evaluate_key(generation: str) -> str:
    return f"{StepKind.EVALUATE.prefix}{generation}"


def plan_key(gallery: str, generation: str, *, full: bool = False) -> str:
    """The plan step's key; ``full``: the plan escalated to re-embed every shard."""
    return f"{StepKind.PLAN.prefix}{gallery}:{generation}" + (f":{_FULL}" if full else "")


def shard_update_key(kind: StepKind, gallery: str, shard: int, generation: str) -> str:
    """The key of one shard update (``kind``: ``EMBED`` or ``SPLIT``) of ``shard`` of ``gallery``."""
    if kind not in (StepKind.EMBED, StepKind.SPLIT):
        raise ValueError(f"a shard update is an embed or a split step, not {kind.value!r}")
    return f"{kind.prefix}{gallery}/{int(shard)}:{generation}"


def gallery_eval_key(gallery: str, generation: str) -> str:
    return f"{StepKind.GALLERY_EVAL.prefix}{gallery}:{generation}"


def gate_key(gallery: str, generation: str) -> str:
    return f"{StepKind.GATE.prefix}{gallery}:{generation}"


def deploy_key(generation: str) -> str:
    return f"{StepKind.DEPLOY.prefix}{generation}"


def redeploy_key(generation: str, number: int) -> str:
    return f"{StepKind.REDEPLOY.prefix}{generation}:{int(number)}"


def integrity_key(location: str) -> str:
    """The key of the hashes of the index file at ``location`` (a URI, or ``storage:<path>``)."""
    return f"{StepKind.INTEGRITY.prefix}{location}"


def source_key(gallery: str) -> str:
    return f"{StepKind.SOURCE.prefix}{gallery}"


def store_key(gallery: str, store: str) -> str:
    """The key recording that ``gallery`` writes to the store whose hash is ``store``."""
    return f"{StepKind.STORE.prefix}{gallery}:{store}"


def parse_step_key(key: str) -> StepKey:
    """The kind and fields of the stored step key ``key``; ValueError naming the key if it is of no
    known kind or its fields do not fit its kind."""
    head, sep, rest = key.partition(":")
    try:
        kind = StepKind(head)
    except ValueError:
        raise ValueError(f"step key {key!r}: unknown kind {head!r}") from None
    fields = rest.split(":")
    if not sep or not rest:
        raise ValueError(f"step key {key!r}: nothing after the kind")
    if kind is StepKind.INTEGRITY:
        return StepKey(kind, location=rest)
    if kind in (StepKind.TRAIN, StepKind.EVALUATE, StepKind.DEPLOY) and len(fields) == 1:
        return StepKey(kind, generation=rest)
    if kind is StepKind.SOURCE and len(fields) == 1:
        return StepKey(kind, gallery=rest)
    if kind is StepKind.PLAN and (len(fields) == 2 or (len(fields) == 3 and fields[2] == _FULL)):
        return StepKey(kind, gallery=fields[0], generation=fields[1], full=len(fields) == 3)
    if kind in (StepKind.GALLERY_EVAL, StepKind.GATE) and len(fields) == 2:
        return StepKey(kind, gallery=fields[0], generation=fields[1])
    if kind is StepKind.STORE and len(fields) == 2:
        return StepKey(kind, gallery=fields[0], store=fields[1])
    if kind is StepKind.REDEPLOY and len(fields) == 2 and fields[1].isdigit():
        return StepKey(kind, generation=fields[0], number=int(fields[1]))
    if kind in (StepKind.EMBED, StepKind.SPLIT) and len(fields) == 2:
        gallery, slash, shard = fields[0].rpartition("/")
        if slash and gallery and shard.isdigit():
            return StepKey(kind, gallery=gallery, shard=int(shard), generation=fields[1])
    raise ValueError(f"step key {key!r}: not the form of a {kind.value!r} key")


def kind_of(key: str) -> StepKind | None:
    """The kind of step ``key`` (None: no known kind), without checking the rest of the key."""
    head, sep, _ = key.partition(":")
    try:
        return StepKind(head) if sep else None
    except ValueError:
        return None


def integrity_location(key: str) -> str | None:
    """The index location an ``integrity:`` key names; None for a key of another kind."""
    return key[len(StepKind.INTEGRITY.prefix):] if kind_of(key) is StepKind.INTEGRITY else None


def map_location(key: str, fn: Callable[[str], str]) -> str:
    """``key`` with ``fn`` applied to the location it names (an ``integrity:`` key, or that prefix
    followed by part of a location); any other key unchanged. How the store records a key's location
    relative to its storage root and resolves it again (``lineage.locations``)."""
    if kind_of(key) is not StepKind.INTEGRITY:
        return key
    return integrity_key(fn(key[len(StepKind.INTEGRITY.prefix):]))
