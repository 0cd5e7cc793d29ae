"""Connecting to Ray: a local instance with the environment training needs, or a cluster."""
from __future__ import annotations

import os

from orchestrator.methods.registry import PLUGINS_ENV

# Ray Train 2.60 hands a worker's ``ray.train.report`` to the controller only when the controller
# polls its workers (every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, 2 s by default), and a worker's next
# report waits for that: epochs shorter than the interval were paced by it (benchmarks/README.md).
WORKER_ENV_VARS = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}


def connect(address: str | None = None, dashboard: bool = False) -> str | None:
    """Join the cluster at ``address`` ("auto", host:port, ray://…), or the one RAY_ADDRESS names
    (as under ``ray job submit``); otherwise start a local Ray whose workers get
    ``WORKER_ENV_VARS`` and the driver's ORCHESTRATOR_PLUGINS, with its dashboard when
    ``dashboard``. Workers' own logs stay in Ray's log files (progress is reported from the training
    checkpoints). No-op when already connected.

    Returns the dashboard's address (``http://127.0.0.1:8265``) when Ray reports one on connecting,
    else None. On a cluster, set the same variables in the cluster's environment (see README)."""
    import ray

    if ray.is_initialized():
        return None
    if address in (None, "local") and not os.environ.get("RAY_ADDRESS"):
        env_vars = dict(WORKER_ENV_VARS)
        if os.environ.get(PLUGINS_ENV):
            env_vars[PLUGINS_ENV] = os.environ[PLUGINS_ENV]
        # address "local": a new instance even when a `ray start` cluster runs on this machine
        # (plain ray.init() would join that one, which the file did not ask for)
        context = ray.init(address="local", include_dashboard=dashboard, log_to_driver=False,
                           runtime_env={"env_vars": env_vars})
    else:
        context = ray.init(address=None if address in (None, "local") else address, log_to_driver=False)
    return dashboard_address(getattr(context, "dashboard_url", None))


def dashboard_address(url: str | None) -> str | None:
    """Ray's ``dashboard_url`` (``127.0.0.1:8265``, empty without a dashboard) as an http address."""
    if not url:
        return None
    return url if "://" in url else f"http://{url}"


def dashboard_message(url: str) -> str:
    """The line a run prints for the dashboard at ``url`` (Ray ≥ 2.59 asks a local dashboard's
    visitors for the cluster's token)."""
    return f"Ray dashboard: {url} (its token, if it asks: ray get-auth-token)"
