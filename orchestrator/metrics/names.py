"""The names of the retrieval metrics every report, table and sweep uses (no torch: the command
line's parsers offer them as choices)."""
from __future__ import annotations

# CMC@1, CMC@5 and full-ranking mAP, and the two that the summaries and the lineage print.
METRICS: tuple[str, ...] = ("cmc@1", "cmc@5", "map")
KEY_METRICS: tuple[str, ...] = ("cmc@1", "map")

# the scores of an update that are reported per metric (``update_summary``'s keys); the normalised
# ones (P_com, P_up) need the evaluation reference φ_*
NORMALISED_SCORES: tuple[str, ...] = ("p_com", "p_up")
UPDATE_SCORES: tuple[str, ...] = ("self", "cross", *NORMALISED_SCORES)
