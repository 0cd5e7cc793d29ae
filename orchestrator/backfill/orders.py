"""Backfill orders by name: which items a new generation re-embeds first, one registry.

An order turns one stored shard into (n,) finite float64 priorities, higher = re-embed earlier.
``register_order`` adds one (a class with a ``name``), as methods are registered; pipeline files,
the planner and the Ray scoring tasks all look orders up here, so a new order is one class.

Orders that need the gallery-wide class means (``needs_class_means``) are scored in two passes:
per-shard class sums (``metrics.class_means.class_sums``), then distances to the combined means.
Torch-free: scoring tasks import this without torch.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from orchestrator.backfill.compatibility_order import least_compatible_priority
from orchestrator.backfill.random_order import random_priority
from orchestrator.metrics.class_means import distances_to_class_means

if TYPE_CHECKING:
    from orchestrator.gallery.shard_files import ShardEmbeddings


@dataclass(frozen=True)
class OrderInputs:
    """What an order may use besides the shard: ``where`` (for error messages), the ``seed``, each
    stored generation's compatibility rank (``least_compatible``), the gallery-wide class means
    and the shard's features for them (F(h_old), or the embeddings: ``class_mean_distance``)."""

    where: str
    seed: int = 0
    generation_ranks: Mapping[str, int] | None = None
    class_means: Mapping[int, np.ndarray] | None = None
    features: np.ndarray | None = None


class BackfillOrder:
    """One order: ``priorities(shard, inputs, index)`` → (n,) float64, higher first (``index``: the
    stored shard's, for messages)."""

    name: ClassVar[str]
    needs_labels: ClassVar[bool] = False
    needs_class_means: ClassVar[bool] = False
    needs_generation_ranks: ClassVar[bool] = False

    def priorities(self, shard: ShardEmbeddings, inputs: OrderInputs, index: int) -> np.ndarray:
        raise NotImplementedError


ORDERS: dict[str, BackfillOrder] = {}


def register_order(cls: type[BackfillOrder]) -> type[BackfillOrder]:
    """Class decorator: make ``cls`` the order named ``cls.name`` (a name is registered once)."""
    if cls.name in ORDERS:
        raise ValueError(f"backfill order {cls.name!r} is registered already")
    ORDERS[cls.name] = cls()
    return cls


def get_order(name: str) -> BackfillOrder:
    """The order ``name`` (ValueError naming the known ones)."""
    if name not in ORDERS:
        raise ValueError(f"unknown backfill order {name!r} (known: {', '.join(ORDERS)})")
    return ORDERS[name]


def shard_priorities(shard: ShardEmbeddings, order: str, inputs: OrderInputs, index: int) -> np.ndarray:
    """Priorities of stored shard ``index`` under ``order``, checked: labels where the order needs
    them, finite values (ValueError naming ``inputs.where`` and the shard otherwise)."""
    chosen = get_order(order)
    if chosen.needs_labels and (shard.labels < 0).any():
        raise ValueError(f"{inputs.where}: needs gallery labels; shard {index} has items without a label")
    scores = np.asarray(chosen.priorities(shard, inputs, index), dtype=np.float64)
    if not np.isfinite(scores).all():
        raise ValueError(f"{inputs.where}: shard {index} has non-finite priorities")
    return scores


@register_order
class UncertaintyOrder(BackfillOrder):
    """HBCT hyperbolic uncertainty of the OLD embedding, highest first (HBCT §5 eq. 10, §14): the
    stored ``uncertainty`` column, 1 − ‖h_s‖/h_t (``geometry.lorentz.uncertainty``)."""

    name = "uncertainty"

    def priorities(self, shard, inputs, index):
        if shard.space != "lorentz":
            raise ValueError(f"{inputs.where}: needs hyperbolic (Lorentz) embeddings, but shard {index} holds "
                             f"generation {shard.generation!r} in space {shard.space!r}")
        return shard.uncertainty.astype(np.float64)


@register_order
class RandomOrder(BackfillOrder):
    """FCT / FastFill's random baseline: a seeded hash of (seed, item id) (``random_priority``)."""

    name = "random"

    def priorities(self, shard, inputs, index):
        return random_priority(shard.ids, inputs.seed)


@register_order
class ClassMeanDistanceOrder(BackfillOrder):
    """λ-orthogonality §2.11: ‖F(h_i) − μ_{y_i}‖₂ to the gallery-wide class mean, farthest first."""

    name = "class_mean_distance"
    needs_labels = True
    needs_class_means = True

    def priorities(self, shard, inputs, index):
        return distances_to_class_means(inputs.features, shard.labels, inputs.class_means)


@register_order
class LeastCompatibleOrder(BackfillOrder):
    """The stored generation the new one searches worst first, seeded random within a generation
    (``compatibility_order``)."""

    name = "least_compatible"
    needs_generation_ranks = True

    def priorities(self, shard, inputs, index):
        rank = (inputs.generation_ranks or {}).get(shard.generation)
        if rank is None:
            raise ValueError(f"{inputs.where}: no compatibility of the new generation with {shard.generation!r} is "
                             f"recorded (shard {index})")
        return least_compatible_priority(shard.ids, rank, inputs.seed)
