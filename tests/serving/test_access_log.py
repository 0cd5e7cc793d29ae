"""Serve's access log line per request: off unless ``--access-log`` asks for it, in every
deployment of the application (the ingress, and the pools' encoder and shard searchers), as Ray
Serve is told through each deployment's ``logging_config``."""
import pytest

from orchestrator.serving.app import application
from orchestrator.serving.settings import Pools, ServeSettings, parse_serve_arguments


def deployments(app) -> dict[str, dict]:
    """Name → logging config of every deployment bound in ``app`` (the ingress, and the
    applications it was bound with). Serve keeps the bound deployment on a private attribute."""
    found, pending = {}, [app]
    while pending:
        deployment = pending.pop()._bound_deployment
        found[deployment.name] = deployment.logging_config
        for argument in deployment.init_args:
            pending += [a for a in (argument if isinstance(argument, list) else [argument]) if hasattr(a, "_bound_deployment")]
    return found


@pytest.mark.parametrize("argv, on", [([], False), (["--access-log"], True)])
def test_the_option_reaches_the_settings(argv, on):
    assert parse_serve_arguments(["pipeline.yaml", *argv]).access_log is on


@pytest.mark.parametrize("search_replicas, names", [(0, {"gallery"}),
                                                    (2, {"gallery", "encoder", "shards-0-of-2", "shards-1-of-2"})])
@pytest.mark.parametrize("on", [False, True])
def test_every_deployment_logs_requests_only_when_asked(search_replicas, names, on):
    found = deployments(application(ServeSettings(None, access_log=on), Pools(search_replicas=search_replicas)))
    assert set(found) == names
    assert {name: config["enable_access_log"] for name, config in found.items()} == dict.fromkeys(names, on)
