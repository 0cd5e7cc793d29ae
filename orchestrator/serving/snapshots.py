"""Snapshots of the served gallery, and following the lineage from one to the next.

A snapshot is what one request is answered from: one lineage deployment (its id and serving
generation) and one shard map (every non-empty shard's generation, files and sha256, the fields a
``deploy:<gen>`` step records: ``pipeline.operations.shard_snapshot``). Its id is the first 16 hex
digits of the sha256 of that state, so every replica following one lineage names the same state
alike, and every response carries it.

``SnapshotHolder`` keeps the current snapshot in one reference. A poll (``poll``: the current
deployment and the gallery's shard rows, two cheap queries, re-read until the deployment did not
change in between) runs every ``poll_s`` seconds off the request path; when the state differs it
builds the new snapshot completely (models and indexes checked against the lineage's hashes;
what an earlier snapshot loaded for the models and shards that did not change is reused), for the
deployed generation and for the other generations requests named lately (at most
``MAX_OTHER_GENERATIONS``), and only then swaps the reference. A request takes the
reference once (``use``) and is answered from that snapshot whatever swaps meanwhile. A state the
router refuses (``IncompatibleShards`` while a backfill writes shards of a generation not deployed
yet, with ``on_incompatible="refuse"``) or that fails to load is not served: the last snapshot
stays, and ``status()["pending"]`` says why; the same state is tried again after
``RETRY_FAILED_S``.

Old snapshots are reference-counted: a replaced snapshot stays listed (``held_uris``: what the
server's lease keeps from ``gc``) until its last in-flight request has finished.
"""
from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from orchestrator.lineage import LineageStore
from orchestrator.lineage.records import ShardRecord
from orchestrator.pipeline.operations import shard_snapshot

log = logging.getLogger(__name__)

#: Seconds before a lineage state that failed to load is tried again.
RETRY_FAILED_S = 30.0
#: Generations besides the deployed one whose services a snapshot holds (and prebuilds) at most.
MAX_OTHER_GENERATIONS = 3


@dataclass(frozen=True)
class LineageState:
    """The deployment and shard rows a snapshot serves (``shards``: the non-empty ones)."""

    deployment_id: int
    generation: str
    shards: tuple[ShardRecord, ...]

    @property
    def shard_map(self) -> list[dict[str, Any]]:
        return shard_snapshot(list(self.shards))

    @property
    def snapshot_id(self) -> str:
        return snapshot_id(self.deployment_id, self.generation, self.shard_map)

    @property
    def uris(self) -> set[str]:
        """The shard files (embeddings and indexes) this state serves."""
        return {uri for s in self.shards for uri in (s.embeddings_uri, s.index_uri) if uri}


def snapshot_id(deployment_id: int, generation: str, shard_map: list[dict[str, Any]]) -> str:
    """The id of a served state: the first 16 hex digits of the sha256 of the deployment id, the
    serving generation and the non-empty shards' rows (``shard_snapshot``, ordered by shard)."""
    rows = sorted((row for row in shard_map if row["n_items"]), key=lambda row: row["index"])
    text = json.dumps([deployment_id, generation, rows], sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def read_state(store: LineageStore, gallery: str) -> LineageState:
    """The lineage's current deployment and ``gallery``'s shard rows, read consistently (again
    while a deployment commits between the reads). ValueError when nothing is deployed."""
    while True:
        before = store.current_deployment()
        if before is None:
            raise ValueError("no generation is deployed yet: run the pipeline first")
        shards = tuple(s for s in store.shards(gallery) if s.n_items and s.generation is not None)
        after = store.current_deployment()
        if after is not None and after.id == before.id:
            return LineageState(before.id, before.generation, shards)


@dataclass
class Snapshot:
    """A lineage state and what answers from it: ``service(generation)``, the search service of any
    generation over exactly this state's shards; the deployed one is built first, and the others
    (``build_others``) before the snapshot is served. A generation no one built for this snapshot
    is built on the request that first names it (and, through ``on_built``, prebuilt for the next
    snapshots). At most ``1 + MAX_OTHER_GENERATIONS`` services are held, the other generation built
    first dropped first."""

    state: LineageState
    build_service: Callable[[LineageState, str], Any]
    on_built: Callable[[str], None] = lambda generation: None
    in_flight: int = 0
    _services: collections.OrderedDict = field(default_factory=collections.OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def id(self) -> str:
        return self.state.snapshot_id

    def service(self, generation: str | None = None) -> Any:
        generation = generation or self.state.generation
        built = self._services.get(generation)  # requests for a built one never wait for another's build
        if built is None:
            with self._lock:
                if generation not in self._services:
                    self._services[generation] = self.build_service(self.state, generation)
                    while len(self._services) > 1 + MAX_OTHER_GENERATIONS:
                        oldest = next(g for g in self._services if g != self.state.generation)
                        del self._services[oldest]
                built = self._services[generation]
        if generation != self.state.generation:
            self.on_built(generation)
        return built

    def build_others(self, generations: list[str]) -> None:
        """Build the services of ``generations`` now (a generation that fails is left to its next
        request, which then gets the error)."""
        for generation in generations:
            if generation == self.state.generation:
                continue
            try:
                self.service(generation)
            except Exception as error:  # a request naming it gets the error
                log.warning("snapshot %s: generation %s not prebuilt: %s", self.id, generation, error)


class SnapshotHolder:
    """The current snapshot of one gallery, following the lineage (module docstring).

    read:      () → the lineage's ``LineageState`` now.
    build_service: (state, generation) → the search service of ``generation`` over ``state``.
    on_held:   called with ``held_uris()`` after every poll (the server's lease), or None.
    """

    def __init__(self, read: Callable[[], LineageState], build_service: Callable[[LineageState, str], Any],
                 poll_s: float = 1.0, on_held: Callable[[set[str]], None] | None = None):
        self._read, self._build_service, self.poll_s, self._on_held = read, build_service, poll_s, on_held
        self._lock = threading.Lock()
        self._retired: list[Snapshot] = []
        self._failed: tuple[str, float, str] | None = None  # (snapshot id, when, why)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.swaps = 0
        self._others: collections.OrderedDict[str, None] = collections.OrderedDict()  # most recently named last
        self._current = self._build(self._read())

    def _build(self, state: LineageState) -> Snapshot:
        snapshot = Snapshot(state, self._build_service, self._named)
        snapshot.service()  # the deployed generation's models and indexes, before it can be served
        snapshot.build_others(list(self._others))  # the other generations requests named lately
        return snapshot

    def _named(self, generation: str) -> None:
        """A request was answered for ``generation`` (not the deployed one): prebuild it from now on."""
        with self._lock:
            self._others[generation] = None
            self._others.move_to_end(generation)
            while len(self._others) > MAX_OTHER_GENERATIONS:
                self._others.popitem(last=False)

    @contextlib.contextmanager
    def use(self) -> Iterator[Snapshot]:
        """The current snapshot, counted as in use until the block ends."""
        with self._lock:
            snapshot = self._current
            snapshot.in_flight += 1
        try:
            yield snapshot
        finally:
            with self._lock:
                snapshot.in_flight -= 1

    @property
    def current(self) -> Snapshot:
        return self._current

    def poll(self) -> bool:
        """Read the lineage; build and swap in its state when it changed and is servable. True
        when the served snapshot changed."""
        state = self._read()
        if state.snapshot_id == self._current.id:
            self._failed = None
            changed = False
        elif self._failed and self._failed[0] == state.snapshot_id and time.monotonic() - self._failed[1] < RETRY_FAILED_S:
            changed = False
        else:
            changed = self._swap_to(state)
        if self._on_held is not None:
            self._on_held(self.held_uris())
        return changed

    def _swap_to(self, state: LineageState) -> bool:
        started = time.perf_counter()
        try:
            snapshot = self._build(state)
        except Exception as error:  # an unservable state: keep serving the last snapshot
            reason = " ".join(str(error).split()) or type(error).__name__
            self._failed = (state.snapshot_id, time.monotonic(), f"{type(error).__name__}: {reason}")
            log.warning("lineage state %s (deployment %s, %s) is not served: %s", state.snapshot_id,
                        state.deployment_id, state.generation, self._failed[2])
            return False
        with self._lock:
            self._retired.append(self._current)
            self._current = snapshot
            self.swaps += 1
        self._failed = None
        log.info("serving snapshot %s (deployment %s, %s), built in %.0f ms", snapshot.id, state.deployment_id,
                 state.generation, 1000 * (time.perf_counter() - started))
        return True

    def held_uris(self) -> set[str]:
        """The files of the current snapshot and of every replaced one still answering a request."""
        with self._lock:
            self._retired = [s for s in self._retired if s.in_flight > 0]
            held = [self._current, *self._retired]
        return set().union(*(s.state.uris for s in held))

    def status(self) -> dict[str, Any]:
        with self._lock:
            current, retired = self._current, [s for s in self._retired if s.in_flight > 0]
        state = current.state
        generations: dict[str, list[int]] = {}
        for shard in state.shards:
            generations.setdefault(shard.generation, []).append(shard.index)
        return {"snapshot": current.id, "deployment": state.deployment_id, "serving": state.generation,
                "shards_by_generation": generations, "items": sum(int(s.n_items) for s in state.shards),
                "swaps": self.swaps, "retired_in_flight": [s.id for s in retired],
                "pending": None if self._failed is None else {"snapshot": self._failed[0], "reason": self._failed[2]}}

    def start(self) -> None:
        """Poll every ``poll_s`` seconds in a daemon thread until ``stop``."""
        self._thread = threading.Thread(target=self._follow, name="lineage-follower", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _follow(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception:  # a lineage read failed (database restarting): try again next poll
                log.exception("polling the lineage failed; serving snapshot %s meanwhile", self._current.id)
