"""Which embeddings of the queries a search takes: the serving generation's, and the same queries
embedded by each generation a spherical interpolation path needs (``slerp``: the old generation's
own embedding of the query; ``SearchRouter.query_generations``).

One rule for every front end that takes given embeddings keyed by generation: ``POST /search``'s
``"embeddings"`` object (``serving.requests.keyed_queries``) and ``orchestrator search``'s query
files with ``embeddings@<generation>`` arrays (``search.queries.read_query_file``). Each front end
names what it was given (``subject``), so the one line says where to look. No torch, no Ray.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np


def split_by_generation(keyed: Mapping[str, np.ndarray], serving: str, needed: Sequence[str],
                        widths: Callable[[str], int], subject: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(the serving generation's (Q, D) queries, {generation: (Q, D_g)} for each of ``needed``) of
    ``keyed`` (generation → (Q, D_g) embeddings of the same Q queries), exactly the generations
    ``[serving, *needed]``, each as wide as ``widths(generation)``. ValueError, one line starting
    with ``subject``, when one is missing, is not used by this search, or has another width."""
    expected = [serving, *needed]
    missing = [name for name in expected if name not in keyed]
    if missing:
        raise ValueError(f"{subject} has no entry for generation(s) {missing}; this search takes {expected}")
    unused = sorted(set(keyed) - set(expected))
    if unused:
        raise ValueError(f"{subject} has entries for generation(s) {unused} this search does not use; it takes "
                         f"{expected}")
    for name in expected:
        check_width(keyed[name], widths(name), name, subject)
    return keyed[serving], {name: keyed[name] for name in needed}


def check_width(embeddings: np.ndarray, width: int, generation: str, subject: str) -> None:
    """ValueError, one line starting with ``subject``, unless the (Q, D) embeddings are ``width``
    wide, the width ``generation`` embeds in."""
    if embeddings.shape[1] != width:
        raise ValueError(f"{subject} has {embeddings.shape[1]} values per query for generation {generation!r}, which "
                         f"embeds {width}")
