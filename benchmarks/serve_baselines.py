"""What a team would run instead of ``orchestrator serve``, on the same vectors (``serve_load``):

- ``plain FAISS over HTTP``: the shards' own FAISS indexes (the ``IndexIDMap2`` inside each
  ``ShardIndex``, written with ``faiss.write_index`` and read back in another process), behind a
  minimal aiohttp server (``POST /search``: ``{"queries": [[…]]}`` of search vectors in FAISS's
  form → ``{"ids": [[…]]}``): every shard searched, the k best candidates kept by FAISS's own
  float32 score, no lineage, no snapshot, no re-rank, no metadata. Loaded by the same closed-loop
  clients as the server.
- ``Lance (embedded)``: the project's Lance store (``stores.lance.LanceStore``, pylance: the
  format and engine LanceDB embeds) holding the same shards, searched in this process one query
  per call over every shard and merged as the router merges (``benchmarks.stores.search_all``):
  exact for ``flat``, an ``IVF_HNSW_SQ`` index for ``hnsw``, candidates re-ranked in float64.

``exact_top_k`` is the ground truth of recall@10: the k items of largest Lorentz inner product
⟨q, x⟩_L = −q₀x₀ + Σᵢ qᵢxᵢ (float64, over all N), i.e. the k smallest geodesic distances
d = arccosh(−K⟨q, x⟩_L)/√K, which decrease as ⟨q, x⟩_L grows.
"""
from __future__ import annotations

import asyncio
import multiprocessing
import socket
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

#: Queries of the ground truth computed at once ((chunk, N) float64 scores).
TRUTH_CHUNK = 64


def on_hyperboloid(points: np.ndarray, curv: float) -> np.ndarray:
    """(N, D) float64: the points' time coordinate recomputed from their space part,
    x₀ = √(1/K + ‖x_s‖²), as the shard indexes store and search them."""
    out = points.astype(np.float64)
    out[:, 0] = np.sqrt(1.0 / curv + (out[:, 1:] ** 2).sum(axis=1))
    return out


def exact_top_k(embeddings: np.ndarray, queries: np.ndarray, k: int, curv: float) -> np.ndarray:
    """(Q, k) ids (rows of ``embeddings`` (N, D)) of the k nearest items of each (Q, D) Lorentz
    query by geodesic distance on the hyperboloid of curvature −``curv``, nearest first (module
    docstring)."""
    gallery = on_hyperboloid(embeddings, curv)
    gallery[:, 0] = -gallery[:, 0]  # ⟨q, x⟩_L = q · [−x₀, x₁…]
    out = []
    for start in range(0, len(queries), TRUTH_CHUNK):
        scores = on_hyperboloid(queries[start:start + TRUTH_CHUNK], curv) @ gallery.T
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1, kind="stable")
        out.append(np.take_along_axis(top, order, axis=1))
    return np.concatenate(out)


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean over queries of |found ∩ truth| / k, both (Q, k) ids."""
    k = truth.shape[1]
    return float(np.mean([len(set(a.tolist()) & set(b.tolist())) / k for a, b in zip(found, truth)]))


def plain_search(indexes: list[Any], searched: np.ndarray, k: int) -> np.ndarray:
    """(Q, k) ids of the k best candidates of the (Q, D') FAISS-form ``searched`` vectors over
    every index, by FAISS's score (L2 ascending, inner product descending)."""
    import faiss

    scores, ids = zip(*(index.search(searched, k) for index in indexes))
    score, found = np.concatenate(scores, axis=1), np.concatenate(ids, axis=1)
    ascending = indexes[0].metric_type == faiss.METRIC_L2
    order = np.argsort(score if ascending else -score, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(found, order, axis=1)


def _serve_plain(paths: list[str], k: int, report: Connection) -> None:
    """The minimal FAISS server (module docstring), until terminated; run in its own process. It
    listens on a port the system chooses (a port picked beforehand can be taken, by another
    process's outgoing connection for one, before the server binds it) and sends it on ``report``."""
    import faiss
    from aiohttp import web

    faiss.omp_set_num_threads(1)
    indexes = [faiss.read_index(path) for path in paths]

    async def search(request: web.Request) -> web.Response:
        body = await request.json()
        searched = np.asarray(body["queries"], dtype=np.float32)
        return web.json_response({"ids": plain_search(indexes, searched, k).tolist()})

    app = web.Application()
    app.router.add_post("/search", search)
    listener = socket.create_server(("127.0.0.1", 0))
    report.send(listener.getsockname()[1])
    web.run_app(app, sock=listener, print=None, access_log=None)


class PlainFaissServer:
    """``_serve_plain`` in a spawned process on 127.0.0.1 (``url`` once entered), over the FAISS
    indexes of ``routes`` (the router's), written under ``folder``; a context manager."""

    def __init__(self, routes: list[Any], folder: Path, k: int, start_timeout_s: float = 60.0):
        import faiss

        folder.mkdir(parents=True, exist_ok=True)
        self.paths = []
        for route in routes:
            path = folder / f"shard-{route.shard.index}.faiss"
            faiss.write_index(route.index.index, str(path))
            self.paths.append(str(path))
        self.k, self.start_timeout_s = k, start_timeout_s

    def __enter__(self) -> PlainFaissServer:
        receiver, sender = multiprocessing.Pipe(duplex=False)
        self.process = multiprocessing.get_context("spawn").Process(target=_serve_plain,
                                                                     args=(self.paths, self.k, sender), daemon=True)
        self.process.start()
        sender.close()
        try:
            if not receiver.poll(self.start_timeout_s):
                raise RuntimeError(f"the plain FAISS server did not listen within {self.start_timeout_s:.0f} s")
            try:
                self.url = f"http://127.0.0.1:{receiver.recv()}"
            except EOFError:
                self.process.join(10)
                raise RuntimeError(f"the plain FAISS server exited before listening "
                                   f"(exit code {self.process.exitcode})") from None
            asyncio.run(_wait_until_up(self.url, self.start_timeout_s))
        except BaseException:
            self.__exit__()
            raise
        finally:
            receiver.close()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.process.terminate()
        self.process.join(10)


async def _wait_until_up(url: str, timeout_s: float = 60.0) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"{url}/search") as response:  # any answer (405) means it is up
                    await response.read()
                    return
            except aiohttp.ClientError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the plain FAISS server at {url} did not start within {timeout_s:.0f} s") from None
                await asyncio.sleep(0.2)


def searched_form(routes: list[Any], queries: np.ndarray) -> np.ndarray:
    """(Q, D') float32: the ``queries`` as the shards' FAISS indexes are searched (the first
    route's ``ShardIndex`` query form: Lorentz time negated, the MIPS column for an approximate
    hyperbolic index)."""
    return routes[0].index._query_form(queries.astype(np.float64))[1]


def lance_shards(folder: Path, kind: str, stored: list[Any]) -> list[Any]:
    """The searchers of the shards ``stored`` (``gallery.ShardEmbeddings``, one per shard) written
    into a Lance store under ``folder``: exact for ``flat``, ``IVF_HNSW_SQ`` for ``hnsw``, as
    ``benchmarks/stores.py`` builds them."""
    from benchmarks.stores import make_store

    store = make_store("lance/exact" if kind == "flat" else "lance/hnsw", folder, None)
    written = [store.write_shard(index, shard, f"bench:{index}", first_attempt=False) for index, shard in enumerate(stored)]
    if kind != "flat":
        store.build_index(f"{stored[0].generation}.lance", stored[0].space)
    return [store.open_shard(uri, record) for uri, record in written]


def time_lance(shards: list[Any], queries: np.ndarray, seconds: float, k: int) -> tuple[list[float], np.ndarray]:
    """(latency of each one-query call over every shard, for ``seconds``; the (Q, k) ids of one
    pass over ``queries``)."""
    from benchmarks.stores import search_all

    found = np.stack([search_all(shards, query[None, :], k)[1][0] for query in queries])
    latencies, started = [], time.perf_counter()
    while time.perf_counter() - started < seconds:
        query = queries[len(latencies) % len(queries)][None, :]
        began = time.perf_counter()
        search_all(shards, query, k)
        latencies.append(time.perf_counter() - began)
    return latencies, found
