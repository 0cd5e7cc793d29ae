"""The rules of a generation that trains no encoder (a post-hoc method: ``procrustes``,
``low_rank_affine``, ``residual_mlp``, ``slerp``; ``orchestrator.methods.posthoc``).

Its encoder is given and frozen: backbone, projection, lift and head come unchanged from
``encoder_from`` (a generation of the file) or ``model.pretrained`` (a local file); only a map to
its parent's space is fitted, on a paired sample (``method.params.pairs``, ``pairs_from``). The
validation says so where a file asks for anything else.
"""
from __future__ import annotations

from typing import Any

from orchestrator.config.problems import problem, suggest
from orchestrator.geometry.spaces import Space
from orchestrator.models.encoder_config import HUB

#: The encoder settings a given encoder must share with the generation that trained it.
ENCODER_FIELDS = ("arch", "embed_dim", "in_chans", "small_input")
#: ``training`` fields a post-hoc generation reads: the seed and the batch size of its embedding passes.
USED_TRAINING_FIELDS = {"seed", "batch_size"}
FROZEN = "its encoder is given and frozen (backbone, projection, lift and head); only its map to the parent is fitted"


def trains_encoder(gen) -> bool:
    """Whether ``gen``'s method trains its encoder (False for the post-hoc methods)."""
    from orchestrator.methods.registry import method_description

    return method_description(gen.method.name).trains_encoder


def generation_problems(gen) -> list[dict[str, Any]]:
    """One generation's own rules: ``encoder_from`` only with a post-hoc method, and a post-hoc
    generation has a given encoder (a generation or a local file: no download), trains nothing
    (no ``init_from_parent``, ``replaces``, or training settings other than their defaults but
    the seed and batch size)."""
    method = gen.method.name
    if trains_encoder(gen):
        if gen.encoder_from is not None:
            return [problem(("encoder_from",), f"takes a generation's encoder unchanged, for a method that trains "
                            f"no encoder (procrustes, low_rank_affine, residual_mlp, slerp), not {method!r}; to start "
                            "training from a generation's weights use init_from_parent", gen.encoder_from)]
        return []
    problems = []
    if gen.encoder_from is None and gen.model.pretrained in (None, HUB):
        problems.append(problem(("encoder_from",), f"method {method!r} trains no encoder: give the encoder it takes "
                                "as given, encoder_from: <an earlier generation> or model.pretrained: <a local "
                                "file> (no download)", None))
    if gen.encoder_from is not None and gen.model.pretrained is not None:
        problems.append(problem(("model", "pretrained"), "unused with encoder_from (that generation's encoder is "
                                "taken)", gen.model.pretrained))
    for flag in ("init_from_parent", "replaces"):
        if getattr(gen, flag):
            problems.append(problem((flag,), f"method {method!r}: {FROZEN}", True))
    defaults = type(gen.training)()
    for name in sorted(set(type(gen.training).model_fields) - USED_TRAINING_FIELDS):
        if getattr(gen.training, name) != getattr(defaults, name):  # a file's normalised form spells out defaults
            problems.append(problem(("training", name), f"unused: method {method!r} trains nothing, {FROZEN} "
                                    "(method.params)", getattr(gen.training, name)))
    return problems


def lineage_problems(generations: list, gallery_source: str | None) -> list[dict[str, Any]]:
    """The rules across generations: ``encoder_from`` names an earlier generation with the same
    encoder settings, space, curvature and clip; the parent embeds in a space a map can write
    (not the Poincaré ball); ``pairs_from: gallery`` needs a gallery drawn from ``data.source``."""
    problems = []
    position = {gen.name: i for i, gen in enumerate(generations)}
    for i, gen in enumerate(generations):
        where = ("generations", i)
        if gen.encoder_from is not None:
            problems += _given_encoder_problems(gen, generations, position, where, i)
        if trains_encoder(gen):
            continue
        parent = generations[position[gen.parent]] if position.get(gen.parent, i) < i else None
        if parent is not None and _space(parent) is Space.POINCARE:
            problems.append(problem((*where, "parent"), f"method {gen.method.name!r} maps into its parent's space: "
                                    "cosine, euclidean or lorentz, not the Poincaré ball", gen.parent))
        elif parent is not None and gen.method.name == "slerp" and _space(parent) not in (None, Space.COSINE):
            problems.append(problem((*where, "parent"), "method 'slerp' interpolates on the unit sphere: the parent must "
                                    f"embed in cosine space, not {_space(parent).value}", gen.parent))
        if gen.method.params.get("pairs_from") == "gallery" and gallery_source is not None:
            problems.append(problem((*where, "method", "params", "pairs_from"), "the paired sample is drawn from the "
                                    "gallery's split of data.source; a gallery with its own source is not supported "
                                    "(use train)", "gallery"))
    return problems


def _given_encoder_problems(gen, generations: list, position: dict[str, int], where: tuple,
                            i: int) -> list[dict[str, Any]]:
    field = (*where, "encoder_from")
    if position.get(gen.encoder_from, i) >= i:
        names = [g.name for g in generations[:i]]
        return [problem(field, f"not a generation defined before this one{suggest(gen.encoder_from, names)}",
                        gen.encoder_from)]
    given = generations[position[gen.encoder_from]]
    problems = []
    differ = [k for k in ENCODER_FIELDS if getattr(given.model, k) != getattr(gen.model, k)]
    if differ:
        problems.append(problem((*where, "model"), f"must be the settings of the encoder it takes, {gen.encoder_from!r}'s: "
                                + ", ".join(f"{k} {getattr(given.model, k)!r}" for k in differ),
                                {k: getattr(gen.model, k) for k in differ}))
    lift = _lift(given)
    if lift is not None and lift != _lift(gen):
        problems.append(problem((*where, "method", "params"), f"the given encoder embeds as {gen.encoder_from!r} "
                                f"trained it: space, curv, clip {lift}", _lift(gen)))
    return problems


def _space(gen) -> Space | None:
    try:
        return gen.method.space
    except ValueError:  # wrong parameters: reported where they are checked
        return None


def _lift(gen) -> tuple | None:
    """(space, curv, clip) of the generation's lift; curv and clip only count in the Lorentz space."""
    space = _space(gen)
    if space is None:
        return None
    if space is not Space.LORENTZ:
        return (space.value,)
    params = gen.method.describe().params
    return (space.value, float(getattr(params, "curv", 1.0)), float(getattr(params, "clip", 1.0)))
