"""Serving a gallery online while it migrates: ``orchestrator serve`` (docs/serving.md).

``requests`` reads and bounds a request; ``snapshots`` follows the lineage and swaps snapshots;
``endpoint`` is the HTTP API without Ray; ``app`` puts it on Ray Serve; ``leases`` tells ``gc``
what a running server holds. Only ``app`` imports Ray.
"""
