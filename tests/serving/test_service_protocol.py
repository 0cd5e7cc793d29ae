"""The service interface a snapshot answers through (``serving.protocols.SnapshotService``) is what
both implementations have: the router in this process (``search.service.SearchService``) and the
replica pools (``serving.pooled.PooledService``), each method with the protocol's parameters and
each property a property, so the endpoint can hold either."""
import inspect

import pytest

from orchestrator.search.service import SearchService
from orchestrator.serving.pooled import PooledService
from orchestrator.serving.protocols import SnapshotService
from protocol_checks import accepts, protocol_methods


@pytest.mark.parametrize("service", [SearchService, PooledService])
def test_both_services_have_the_protocols_methods_and_properties(service):
    for name, declared in protocol_methods(SnapshotService).items():
        assert accepts(inspect.signature(getattr(service, name)), declared), (service.__name__, name)
    for name in ("serving", "width", "query_generations"):  # read-only attributes: a property or a cached one
        assert hasattr(inspect.getattr_static(service, name), "__get__"), (service.__name__, name)
    assert set(protocol_methods(SnapshotService)) == {"encode", "answer", "width_of"}
