"""``orchestrator search FILE``: query a pipeline's served gallery from the command line.

Queries come from files (``--queries``: ``.npy``/``.npz`` images or embeddings, or image files;
see ``orchestrator.search.queries``) or from a split of the pipeline's data source (``--split``,
``--limit``). The deployed generation serves unless ``--serving`` names another. ``--evaluate``
scores the results against labels (the split's, or ``labels`` in an ``.npz``), leaving each query
out of its own results when the queries are gallery items; it ranks the whole gallery (full-ranking
mAP, as the pipeline's report) unless ``--eval-k`` limits the depth. Output: a table per query, or JSON
(``--json``; ``--output FILE`` writes it to a file).
"""
from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from orchestrator.cli_options import add_pipeline_options, int_at_least, pipeline_overrides
from orchestrator.metrics.names import METRICS

if TYPE_CHECKING:
    import numpy as np


def add_search_command(commands: argparse._SubParsersAction) -> None:
    search = commands.add_parser("search", help="search the served gallery with the deployed generation "
                                                 "(older shards along their compatibility path)")
    search.add_argument("file", help="pipeline YAML whose lineage and gallery to search")
    add_pipeline_options(search, ("storage", "lineage"))
    source = search.add_mutually_exclusive_group(required=True)
    source.add_argument("--queries", nargs="+", metavar="PATH",
                        help=".npy/.npz of uint8 images (N,H,W[,3]) or float embeddings (N,D), image files, "
                             "or folders of images")
    source.add_argument("--split", help="take the queries from this split of the pipeline's data source")
    search.add_argument("--limit", type=int_at_least(1), default=None, metavar="N", help="use only the first N queries")
    search.add_argument("-k", "--k", type=int_at_least(1), default=10, help="results per query")
    search.add_argument("--serving", help="the generation whose queries search (default: the deployed one)")
    search.add_argument("--criterion-metric", default="map", choices=METRICS,
                        help="recorded metric of the compatibility criterion that admits older shards")
    search.add_argument("--skip-incompatible", action="store_true",
                        help="search only the shards the serving generation is compatible with (default: refuse)")
    search.add_argument("--evaluate", action="store_true", help="score the search against the query labels")
    search.add_argument("--eval-k", type=int_at_least(5), default=None,
                        help="depth of --evaluate's ranking, at least 5 (default: the whole gallery: full-ranking mAP)")
    search.add_argument("--json", action="store_true", help="print JSON instead of tables")
    search.add_argument("--output", help="write the JSON result to this file")
    search.set_defaults(handler=search_command)


def search_command(args: argparse.Namespace) -> int:
    from orchestrator.config import load_pipeline
    from orchestrator.lineage import LineageStore
    from orchestrator.outside import preflight

    config = load_pipeline(args.file, pipeline_overrides(args))
    preflight(config, storage_must_exist=True)
    LineageStore(config.lineage, storage=config.storage, readonly=True).close()  # a missing store: refused before torch
    from orchestrator.search.service import search_answer, service_for_pipeline

    service = service_for_pipeline(config, args.serving, metric=args.criterion_metric,
                                   on_incompatible="skip" if args.skip_incompatible else "refuse")
    embeddings, others, labels, ids, names = _queries(args, config, service)
    answer = search_answer(service, embeddings, args.k, others)
    report: dict[str, Any] = {"serving": answer["serving"], "gallery": config.gallery.name, "k": args.k,
                              **answer, "queries": names}
    if args.evaluate:
        report["evaluation"] = _evaluate(args, config, service, embeddings, others, labels, ids)
    text = json.dumps(report, indent=2)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    print(text if args.json else _format(report, ids))
    return 0


def _queries(args, config, service) -> tuple[Any, dict[str, Any], np.ndarray | None, np.ndarray | None,
                                            list[str] | None]:
    """(embeddings (N, D), the same queries by the generations a spherical interpolation path needs
    (``SearchService.encode_for_search``, or a query file's ``embeddings@<generation>`` arrays; none for
    plain given embeddings), labels or None, gallery item ids
    or None, query names or None) of the requested queries."""
    from orchestrator.data import load_source
    from orchestrator.search.queries import KEYED_PREFIX, read_query_file

    if args.split is not None:
        images = load_source(config.data.source, **config.data.loader_kwargs(args.split))
        if args.limit is not None:
            import numpy as np

            images = images.subset(np.arange(min(args.limit, len(images))))
        same_items = config.gallery.source is None and args.split == config.gallery.split
        return *service.encode_for_search(images.images), images.labels, images.ids if same_items else None, None
    batch = read_query_file(args.queries, service.image_size)
    stop = len(batch) if args.limit is None else min(args.limit, len(batch))
    others: dict[str, Any] = {}
    if batch.embeddings_by_generation is not None:
        from orchestrator.search.query_generations import split_by_generation

        keyed = {name: found[:stop] for name, found in batch.embeddings_by_generation.items()}
        embeddings, others = split_by_generation(keyed, service.serving, service.query_generations, service.width_of,
                                                 f"query file {args.queries[0]} (arrays '{KEYED_PREFIX}<generation>')")
    elif batch.embeddings is not None:
        if service.query_generations:
            expected = ", ".join(f"'{KEYED_PREFIX}{name}'" for name in (service.serving, *service.query_generations))
            raise ValueError(f"query file {args.queries[0]}: holds generation {service.serving!r}'s embeddings only, "
                             f"but its search interpolates with generation(s) {list(service.query_generations)}'s "
                             f"embeddings of the same queries (slerp): give the arrays {expected} instead")
        embeddings = batch.embeddings[:stop]
    else:
        embeddings, others = service.encode_for_search(batch.images[:stop])
    labels = None if batch.labels is None else batch.labels[:stop]
    ids = None if batch.ids is None else batch.ids[:stop]
    return embeddings, others, labels, ids, None if batch.names is None else list(batch.names[:stop])


def _evaluate(args, config, service, embeddings, others, labels, ids) -> dict[str, Any]:
    from orchestrator.data import load_source
    from orchestrator.data.registry import STREAMED_SOURCES
    from orchestrator.search.router_evaluation import evaluate_search

    if labels is None:
        raise ValueError("--evaluate needs query labels: use --split, or an .npz with a 'labels' array")
    source, kwargs = config.gallery_loader_kwargs()
    if source in STREAMED_SOURCES:
        raise ValueError(f"--evaluate ranks the whole gallery in memory; gallery {config.gallery.name!r} is streamed "
                         f"from {source}: the pipeline's gallery-eval step scores a labelled sample of it instead")
    gallery = load_source(source, **kwargs)
    evaluation = evaluate_search(service.router, embeddings, labels, gallery.ids, gallery.labels, args.eval_k, query_ids=ids,
                                 queries_by_generation=others)
    return evaluation.as_row()


def _format(report: dict[str, Any], ids: np.ndarray | None) -> str:
    lines = [f"gallery {report['gallery']!r} searched by {report['serving']} "
             f"({report['searched_items']} items; " + ", ".join(f"{g}: {p}" for g, p in report["paths"].items()) + ")"]
    lines += [f"not searched: {line}" for line in report["not_searched"]]
    for number, hits in enumerate(report["results"]):
        name = f"query {number}" + ("" if ids is None else f" (item {int(ids[number])})")
        name += "" if report["queries"] is None else f" {report['queries'][number]}"
        lines.append(f"{name}:")
        lines += [f"  {rank:>3}. item {hit['id']:<8} distance {hit['distance']:.4f}  shard {hit['shard']:<3} "
                  f"{hit['generation']}" + (f"  {hit['uri']}" if "uri" in hit else "") for rank, hit in enumerate(hits, 1)]
    if "evaluation" in report:
        row = report["evaluation"]
        lines.append(f"evaluation over the top {row['k']}: cmc@1 {row['cmc@1']:.4f}  cmc@5 {row['cmc@5']:.4f}  "
                     f"mAP@{row['k']} {row['map']:.4f}")
    return "\n".join(lines)
