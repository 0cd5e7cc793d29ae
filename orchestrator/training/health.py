"""Training health: does a generation learn? One rule for every path that trains one.

Two things are judged (``HealthSpec``, the pipeline file's ``generations[i].health``):

- its own retrieval, while it trains (after every epoch from max(min_epochs, ⌈min_fraction ×
  epochs⌉, warm-up + 1) epochs on) and when it ends: CMC@1 of its embeddings against themselves
  (leave-one-out) on a small sample of the evaluation split (``health_sample``: at most
  ``health.sample`` items of the classes it trains on, class-stratified, seeded; never training
  items). It stops when below ``retrieval_floor`` = chance + max(chance_margin, chance_sigmas·σ),
  at most halfway from chance to 1, where chance (``chance_cmc1``) is what a random ranking scores
  on the sample's labels, Σ_c (n_c/n)·(n_c − 1)/(n − 1) (a query's nearest other item is any of
  the n − 1 others alike), and σ = √(chance·(1 − chance)/n) the spread of that score: a floor a
  model at chance does not reach, that any model which learned something passes;
- its loss, when it ends (with at least ``min_epochs`` epochs): the last epoch's total loss must
  be below the first epoch's by ``min_loss_drop`` of its size (only for a generation that starts
  from its seeded initialisation);

and a generation that trains no encoder (``trains_encoder`` false) is judged on its fitted map
instead: the map's fit loss must fall by ``min_fit_drop``.

A failed judgement is a ``HealthStop``: one line naming the generation, the epochs run and what
was seen (``g1: own CMC@1 0.017 after 4 epochs, chance is 0.016 ...``). The callers — the Ray
Train worker (``orchestrator.distributed.train``), a Tune trial (``orchestrator.tuning.trial``)
and ``run_update_experiment`` (through ``train_generation``) — all use ``HealthMonitor``; the
runner turns a stop into a failed ``train:<gen>`` step (``TrainingUnhealthy``) before anything of
the generation is evaluated or deployed.

The measurement runs under ``torch.random.fork_rng`` with the model in eval mode and restores
its mode, so a healthy generation trains bit for bit as it does without the check. No Ray here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from orchestrator.data import ImageTensorDataset
from orchestrator.data.scenarios import stratified_sample
from orchestrator.errors import ExitCode, OrchestratorError
from orchestrator.methods.base import embed_dataset_with_ids
from orchestrator.metrics import retrieval_metrics
from orchestrator.training.config import COLLAPSED, STOP, HealthSpec  # noqa: F401  (re-exported)

MEASURED = ("health/own_cmc@1", "health/chance", "health/first_loss")
FIT_HISTORIES = ("fct_history", "lambda_orth_history", "posthoc_history")  # ctx.state keys of the map fits


class TrainingUnhealthy(OrchestratorError):
    """A generation stopped by the health check: ``line`` is the ``HealthStop``'s one line; a
    pipeline run adds the ``generation``, its step ``key`` and the ``setting`` that holds the
    thresholds, and ``str`` then says that nothing of the generation ran after the step, and how to
    go on."""

    exit_code = ExitCode.UNHEALTHY
    reported_as = "unhealthy"

    def __init__(self, line: str, generation: str | None = None, key: str | None = None,
                 setting: str | None = None):
        self.line, self.key, self.setting = line, key, setting
        text = line
        if key is not None:
            text += (f"; {key} failed, nothing of {generation} was evaluated or deployed. Train it otherwise "
                     f"(its training settings), or change {setting or 'its health settings'}, and run again")
        super().__init__(text)


@dataclass(frozen=True)
class HealthStop:
    """A failed judgement: the generation, the epochs it ran, and what was seen (``line``)."""

    generation: str
    epochs: int
    seen: str

    @property
    def line(self) -> str:
        return f"{self.generation}: {self.seen}"


def chance_cmc1(labels: Sequence[int] | np.ndarray) -> float:
    """The expected leave-one-out CMC@1 of a random ranking of items with ``labels``:
    Σ_c (n_c / n) · (n_c − 1) / (n − 1). NaN for fewer than 2 items."""
    labels = np.asarray(labels)
    n = labels.size
    if n < 2:
        return math.nan
    _classes, counts = np.unique(labels, return_counts=True)
    return float(np.sum(counts * (counts - 1)) / (n * (n - 1)))


def retrieval_floor(chance: float, items: int, spec: HealthSpec) -> float:
    """Own CMC@1 below this stops a generation: chance + max(chance_margin, chance_sigmas · σ) with
    σ = √(chance·(1 − chance)/items), at most halfway from chance to a perfect 1."""
    sigma = math.sqrt(max(chance * (1.0 - chance), 0.0) / max(items, 1))
    return min(chance + max(spec.chance_margin, spec.chance_sigmas * sigma), chance + (1.0 - chance) / 2)


def judge_retrieval(generation: str, epochs: int, own: float, chance: float, items: int,
                    spec: HealthSpec) -> HealthStop | None:
    """A stop when ``own`` (CMC@1 on a sample of ``items``) is below ``retrieval_floor``, else None."""
    if math.isnan(chance):
        return None
    floor = retrieval_floor(chance, items, spec)
    if math.isnan(own) or own < floor:
        return HealthStop(generation, epochs, f"own CMC@1 {own:.3f} after {_epochs(epochs)}, chance is {chance:.3f} "
                                              f"(it stops below {floor:.3f} on {items} items of the evaluation split: "
                                              "health.chance_sigmas, chance_margin)")
    return None


def judge_loss(generation: str, epochs: int, first: float, last: float, spec: HealthSpec) -> HealthStop | None:
    """A stop when the last epoch's loss is not below the first epoch's by ``min_loss_drop`` of
    the first's size, else None."""
    if not (math.isfinite(first) and math.isfinite(last)):
        return None
    if first - last < spec.min_loss_drop * abs(first) or last >= first:
        return HealthStop(generation, epochs, f"loss {last:.4f} after {_epochs(epochs)}, not below the first "
                                              f"epoch's {first:.4f} by {spec.min_loss_drop:.0%} (health.min_loss_drop)")
    return None


def judge_fit(generation: str, epochs: int, fit_losses: Sequence[float], spec: HealthSpec) -> HealthStop | None:
    """For a generation that trains no encoder: a stop when its map's fit loss (one value per fit
    epoch) does not fall by ``min_fit_drop`` of the first fit epoch's, else None."""
    values = [float(v) for v in fit_losses]
    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        return None
    first, last = values[0], values[-1]
    if first - last < spec.min_fit_drop * abs(first) or last >= first:
        seen = (f"its map's fit loss {last:.4f} after {len(values)} fit epochs, not below the first's {first:.4f} "
                f"by {spec.min_fit_drop:.0%} (health.min_fit_drop)")
        return HealthStop(generation, epochs, seen)
    return None


def _epochs(n: int) -> str:
    return f"{n} epoch{'s' if n != 1 else ''}"


def health_sample(images, classes: Sequence[int] | np.ndarray | None, max_items: int, image_size: int,
                  mean: Sequence[float], std: Sequence[float]) -> ImageTensorDataset | None:
    """The own-retrieval sample: the items of ``images`` (the evaluation split, ``LabeledImages``)
    whose class is in ``classes`` (all when None), cut to at most ``max_items`` by a seeded
    class-stratified draw; None when fewer than two classes remain (nothing to tell apart)."""
    if classes is not None:
        images = images.subset(np.flatnonzero(np.isin(images.labels, np.asarray(classes))))
    if len(np.unique(images.labels)) < 2:
        return None
    if len(images) > max_items:
        images = images.subset(stratified_sample(images.labels, max_items / len(images), seed=0))
    return ImageTensorDataset(images, image_size, tuple(mean), tuple(std))


def own_cmc1(model, data: ImageTensorDataset, device: torch.device | str = "cpu") -> tuple[float, float]:
    """(own CMC@1, chance) of ``model`` on ``data``: its embeddings against themselves, leave-one-out,
    in its own space. Leaves torch's RNG, the model's mode and its weights as they were."""
    with torch.random.fork_rng(devices=[]):
        out, labels, ids = embed_dataset_with_ids(model, data, 256, device)
        result = retrieval_metrics(out.embedding, out.embedding, labels, labels, model.space, curv=model.curv,
                                   ks=(1,), query_ids=ids, gallery_ids=ids)
    return float(result.cmc[1]), chance_cmc1(labels.cpu().numpy())


def judged_from(spec: HealthSpec, epochs: int, warmup_epochs: int = 0) -> int:
    """The number of epochs after which own retrieval is first judged during training:
    max(min_epochs, ⌈min_fraction × epochs⌉, warm-up + 1); a generation of fewer epochs is judged
    once, when it ends."""
    return max(spec.min_epochs, math.ceil(spec.min_fraction * epochs - 1e-9), warmup_epochs + 1)


def trains_encoder(model) -> bool:
    """Whether any of the model's encoder parameters is trained."""
    encoder = getattr(model, "encoder", model)
    return any(p.requires_grad for p in encoder.parameters())


class HealthMonitor:
    """The check of one generation's training (module docstring).

    spec:       the generation's ``HealthSpec``; name: the generation.
    epochs, warmup_epochs: its training schedule (judged from max(min_epochs, warmup_epochs + 1)
                epochs on, and always at the last epoch).
    sample:     ``health_sample`` (None: no retrieval check).
    check_loss: whether the loss rule applies (a generation from its seeded initialisation).
    first_loss: the first epoch's loss, when resuming after it (a restored checkpoint's metrics).
    """

    def __init__(self, spec: HealthSpec, name: str, epochs: int, warmup_epochs: int = 0,
                 sample: ImageTensorDataset | None = None, check_loss: bool = True,
                 device: torch.device | str = "cpu", first_loss: float | None = None):
        self.spec, self.name, self.epochs = spec, name, epochs
        self.start = judged_from(spec, epochs, warmup_epochs)
        self.sample, self.check_loss, self.device = sample, check_loss, device
        self.first_loss = first_loss
        self.measured: dict[str, float] = {}

    def due(self, done: int) -> bool:
        """Whether own retrieval is judged after ``done`` epochs."""
        return self.spec.enabled and (done == self.epochs or done >= self.start)

    def after_epoch(self, epoch: int, loss: float, model) -> HealthStop | None:
        """Judge after 0-based ``epoch`` with its mean total ``loss``; the measured numbers are in
        ``measured`` (``MEASURED`` keys) afterwards. ``model`` is measured only when due."""
        if self.first_loss is None or epoch == 0:
            self.first_loss = float(loss)
        self.measured["health/first_loss"] = self.first_loss
        done = epoch + 1
        if not self.due(done) or not trains_encoder(model):
            return None  # one that trains no encoder is judged on its map's fit (``after_training``)
        if self.sample is not None:
            own, chance = own_cmc1(model, self.sample, self.device)
            self.measured.update({"health/own_cmc@1": own, "health/chance": chance})
            stop = judge_retrieval(self.name, done, own, chance, len(self.sample), self.spec)
            if stop is not None:
                return stop
        if self.check_loss and done == self.epochs and done >= max(self.spec.min_epochs, 2):
            return judge_loss(self.name, done, self.first_loss, float(loss), self.spec)
        return None

    def after_training(self, model, state: dict[str, Any]) -> HealthStop | None:
        """After the method's end-of-training hook: a generation that trains no encoder is judged on
        the fit of its map (``FIT_HISTORIES`` in the method's ``state``)."""
        if not self.spec.enabled or trains_encoder(model):
            return None
        for key in FIT_HISTORIES:
            history = state.get(key)
            if history:
                return judge_fit(self.name, self.epochs, [h["loss"] for h in history], self.spec)
        return None
