"""Serving a gallery online while it migrates: ``orchestrator serve`` (docs/serving.md).

``requests`` reads and bounds a request; ``snapshots`` follows the lineage and swaps snapshots;
``endpoint`` is the HTTP API without Ray; ``app`` puts it on Ray Serve. What a running server
holds, ``gc`` learns from its leases (``storage.leases``). Only ``app`` imports Ray.
"""
