"""Which generations a snapshot builds, and when (``serving.snapshots``), with a stand-in for the
search services: the deployed one before the snapshot is served; another generation on the first
request naming it, then before every later snapshot is served (never again on a request); a
generation that fails to build is never prebuilt; at most MAX_OTHER_GENERATIONS of them."""
from __future__ import annotations

import pytest

from orchestrator.serving.snapshots import MAX_OTHER_GENERATIONS, LineageState, SnapshotHolder


class Lineage:
    """A lineage whose deployment an operator moves; the services it builds, in order."""

    def __init__(self):
        self.state = LineageState(1, "g1", ())
        self.builds: list[tuple[int, str]] = []

    def build(self, state: LineageState, generation: str) -> str:
        if generation.startswith("unknown"):
            raise ValueError(f"generation {generation!r} is not in the lineage")
        self.builds.append((state.deployment_id, generation))
        return f"service of {generation} at deployment {state.deployment_id}"


def test_a_named_generation_is_built_once_on_a_request_then_before_each_snapshot_is_served():
    lineage = Lineage()
    holder = SnapshotHolder(lambda: lineage.state, lineage.build, poll_s=3600)
    assert lineage.builds == [(1, "g1")]
    with holder.use() as snapshot:
        assert snapshot.service("g0") == "service of g0 at deployment 1"  # the first request naming g0 builds it
        with pytest.raises(ValueError, match="not in the lineage"):
            snapshot.service("unknown")
    assert lineage.builds == [(1, "g1"), (1, "g0")]

    lineage.state = LineageState(2, "g2", ())  # a deployment: the new snapshot prebuilds g0 too
    assert holder.poll()
    assert lineage.builds[2:] == [(2, "g2"), (2, "g0")]
    with holder.use() as snapshot:
        assert snapshot.service("g0") == "service of g0 at deployment 2" and snapshot.service() == "service of g2 at deployment 2"
    assert len(lineage.builds) == 4  # answered without building


def test_a_snapshot_holds_and_prebuilds_at_most_the_latest_named_generations():
    lineage = Lineage()
    holder = SnapshotHolder(lambda: lineage.state, lineage.build, poll_s=3600)
    named = [f"g0.{n}" for n in range(MAX_OTHER_GENERATIONS + 2)]
    with holder.use() as snapshot:
        for generation in named:
            snapshot.service(generation)
        assert len(snapshot._services) == 1 + MAX_OTHER_GENERATIONS and "g1" in snapshot._services
    lineage.state = LineageState(2, "g1", ())
    holder.poll()
    assert lineage.builds[-1 - MAX_OTHER_GENERATIONS:] == [(2, "g1")] + [(2, g) for g in named[-MAX_OTHER_GENERATIONS:]]
