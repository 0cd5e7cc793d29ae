"""An encoder replica: the models of the generations a snapshot needs, the route plan, and the
embedding of image queries.

``QueryEncoders.plan(state, generation)`` is the router's admission for a snapshot
(``search.service.open_plan``: the compatibility criterion, every shard's comparison path,
refusals), computed where the models are; the ingress sends each share its admitted (shard,
path) pairs. It returns an ``EncoderPlan``: that plan, the key of the searching generation's model
and the width of its embeddings. ``encode(model_key, images)`` embeds (N, H, W, 3) uint8 images
with that model, preprocessed as the gallery was. Models are held by the hashes the lineage holds
for them (``serving.model_cache``): a snapshot whose generations did not change reloads none.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from orchestrator.serving.model_cache import ModelCache, ModelKey
from orchestrator.serving.settings import ServeSettings

if TYPE_CHECKING:
    from orchestrator.lineage import LineageStore
    from orchestrator.lineage.records import GenerationRecord
    from orchestrator.serving.snapshots import LineageState


@dataclass(frozen=True)
class EncoderPlan:
    """A snapshot's route plan (``search.router.RoutePlan``) for one searching generation, the key
    of that generation's model (``ModelCache.key``) and the width D of its embeddings; the same
    for every generation whose embeddings of a query the plan needs too (``model_keys``,
    ``widths``: the plan's ``query_generations``)."""

    plan: Any
    model_key: ModelKey
    width: int
    model_keys: dict[str, ModelKey] = field(default_factory=dict)
    widths: dict[str, int] = field(default_factory=dict)


class QueryEncoders:
    """What an encoder replica holds (module docstring). settings: the server's ``ServeSettings``."""

    def __init__(self, settings: ServeSettings, store: LineageStore | None = None):
        from orchestrator.lineage import LineageStore
        from orchestrator.search.service import query_preprocessing

        config = settings.config
        self.settings = settings
        self.store = store or LineageStore(config.lineage, storage=config.storage, readonly=True, follows_writers=True)
        self.size, self.normalisation = query_preprocessing(config)
        self.models = ModelCache(self.store)
        self._widths: dict[ModelKey, int] = {}

    def plan(self, state: LineageState, generation: str) -> EncoderPlan:
        """The ``EncoderPlan`` of ``generation`` over ``state`` (a ``LineageState``); ValueError
        (``IncompatibleShards`` among them) when the router would refuse it."""
        from orchestrator.search.service import open_plan

        config = self.settings.config
        plan, _models = open_plan(self.store, config.gallery.name, generation, metric=self.settings.metric,
                                  dataset=config.data.eval_split, on_incompatible=self.settings.on_incompatible,
                                  shards=state.shards, load_model=self.models.load)
        keys = {name: self.models.key(self._record(name)) for name in (generation, *plan.query_generations)}
        for key in keys.values():
            if key not in self._widths:
                self._widths[key] = int(self.encode(key, np.zeros((1, self.size, self.size, 3), np.uint8)).shape[1])
        others = [name for name in keys if name != generation]
        return EncoderPlan(plan, keys[generation], self._widths[keys[generation]],
                           {name: keys[name] for name in others}, {name: self._widths[keys[name]] for name in others})

    def encode(self, model_key: ModelKey, images: np.ndarray) -> np.ndarray:
        """(N, H, W, 3) uint8 images → (N, D) float32 embeddings of the model ``model_key`` names
        (loaded and checked when this replica does not hold it; ValueError when the lineage no
        longer holds it)."""
        from orchestrator.search.queries import encode_images

        model = self.models.held(model_key)
        if model is None:  # a replica that did not plan this snapshot (restarted, or one of several)
            record = self._record(model_key[0])
            if self.models.key(record) != model_key:
                raise ValueError(f"generation {model_key[0]!r}: the lineage no longer holds the model this snapshot "
                                 "served (its checkpoint changed)")
            model = self.models.load(record)
        mean, std = self.normalisation
        return encode_images(model, images, self.size, mean, std).numpy()

    def _record(self, generation: str) -> GenerationRecord:
        records = {g.name: g for g in self.store.list_generations()}
        if generation not in records:
            raise ValueError(f"generation {generation!r} is not in the lineage (known: {sorted(records)})")
        return records[generation]
