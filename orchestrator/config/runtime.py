"""Where and how a run runs, not what it computes: the Ray cluster and MLflow tracking sections,
and the URL helpers the pipeline's storage and lineage fields share."""
from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from orchestrator import limits
from orchestrator.config.problems import StrictModel, problem, raise_problems

# MLflow tracking URIs: its SQL stores (with a driver: postgresql+psycopg2://), a tracking server, Databricks
TRACKING_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")


class RaySettings(StrictModel):
    """Where and how widely each generation trains.

    address:         None (or "local") starts a local Ray; "auto" joins the cluster of this node
                     (``ray start --head``, ``ray job submit``); "host:6379"; "ray://host:10001".
    num_workers:     data-parallel training workers (Ray Train ``ScalingConfig.num_workers``); 0 runs
                     Ray Train's local mode: the generation trains in the driver process, with no
                     worker actors to start (about 13 s less per generation on 2 idle cores; small generations,
                     debugging), no epoch checkpoints and no retries (a killed run trains that
                     generation again from its first epoch).
    cpus_per_worker: CPUs reserved per worker.
    gpus_per_worker: GPUs per worker; with ``use_gpu`` and 0 here, one GPU per worker (Ray's default).
    use_gpu:         train on GPUs.
    max_failures:    worker-failure retries of a training run (-1: unlimited; Ray ``FailureConfig``).
    checkpoints_to_keep: the newest epoch checkpoints Ray Train keeps per generation (older ones are
                     deleted; a restarted worker resumes from the newest). The finished generation
                     is saved separately and never deleted.
    dashboard:       a local Ray (address null) starts its dashboard, and the run prints its address
                     (a cluster's dashboard is the cluster's; its address is printed when Ray gives it).
    connect_timeout_s: seconds a command waits for the Ray address (host:port, ray://) and the S3
                     storage's endpoint to answer before it stops, naming them (checked before
                     anything is created).
    """

    address: str | None = None
    num_workers: int = Field(1, ge=0, le=limits.MAX_WORKERS)
    cpus_per_worker: float = Field(1.0, gt=0, le=limits.MAX_CPUS)
    gpus_per_worker: float = Field(0.0, ge=0, le=limits.MAX_GPUS)
    use_gpu: bool = False
    max_failures: int = Field(2, ge=-1, le=limits.MAX_FAILURES)
    checkpoints_to_keep: int = Field(2, ge=1, le=limits.MAX_CHECKPOINTS_TO_KEEP)
    dashboard: bool = False
    connect_timeout_s: float = Field(10.0, gt=0, le=limits.MAX_CONNECT_TIMEOUT_S)

    @field_validator("address")
    @classmethod
    def _check_address(cls, address: str | None) -> str | None:
        if address is None or address.strip() in ("", "local"):
            return None
        address = address.strip()
        if address == "auto" or re.fullmatch(r"ray://[^\s/]+", address) or re.fullmatch(r"[\w.-]+:\d+", address):
            return address
        if address.startswith(("http://", "https://")):
            raise ValueError(
                "that is the dashboard / job-submission address (give it to `ray job submit`); "
                "here use 'auto', 'host:6379' or 'ray://host:10001'"
            )
        raise ValueError("expected null or 'local' (a local Ray), 'auto', 'host:port' or 'ray://host:port'")

    @model_validator(mode="after")
    def _check_gpus(self) -> RaySettings:
        if self.gpus_per_worker > 0 and not self.use_gpu:
            raise_problems([problem(("gpus_per_worker",), "GPUs per worker need use_gpu: true", self.gpus_per_worker)])
        return self


class TrackingSettings(StrictModel):
    """Experiment tracking with MLflow (optional: the ``tracking`` extra, ``pip install -e '.[tracking]'``).

    enabled:    log the run to MLflow: a run per ``orchestrator run`` (the compatibility matrices,
                the report files) and, nested in it, a run per generation (parameters, per-epoch
                losses, checkpoint URI and sha256, compatibility, its update's summary).
    uri:        the MLflow tracking URI (``sqlite:///path/mlflow.db``, ``postgresql://...``,
                ``http(s)://`` server, ``databricks``); default ``sqlite:///<storage>/mlflow.db`` under
                a local storage (required with remote storage when enabled).
    experiment: the MLflow experiment; default the pipeline's name.
    """

    enabled: bool = False
    uri: str | None = None
    # not a Name: an experiment may be a path (Databricks: /Users/<user>/<name>) of a few names
    experiment: str | None = Field(None, min_length=1, max_length=limits.NAME_MAX_LENGTH * 4)

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, uri: str | None) -> str | None:
        if uri is None:
            return None
        uri = uri.strip()
        scheme = url_scheme(uri) or ("databricks" if uri == "databricks" else None)
        if scheme is None or scheme.split("+")[0] not in TRACKING_SCHEMES:
            raise ValueError("expected an MLflow tracking URI: sqlite:///path/mlflow.db, postgresql://..., "
                             "http(s)://host:port or databricks")
        return uri


def url_scheme(url: str) -> str | None:
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", url)
    return match.group(1).lower() if match else None


def local_path(storage: str) -> str:
    return storage[len("file://"):] if storage.startswith("file://") else storage
