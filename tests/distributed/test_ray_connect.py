"""Joining a Ray cluster that refuses (``runtime.connect``) is one ``OutsideSystemError`` line naming
the address, raised where Ray's ``ConnectionError`` arises (ray.init is replaced: no Ray starts)."""
from __future__ import annotations

import pytest
import ray

from orchestrator.distributed import runtime
from orchestrator.errors import ExitCode, OutsideSystemError


@pytest.fixture
def refusing_ray(monkeypatch):
    """``ray.init`` failing as it does when nothing answers at the address; the addresses it got."""
    asked: list[object] = []

    def init(address=None, **_kwargs):
        asked.append(address)
        raise ConnectionError(f"Could not connect to the GCS at {address}:\n  timed out")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    return asked


def test_a_cluster_that_refuses_is_one_line_naming_its_address(refusing_ray, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(OutsideSystemError) as caught:
        runtime.connect("10.1.2.3:6379")
    assert str(caught.value) == ("Ray at 10.1.2.3:6379: Could not connect to the GCS at 10.1.2.3:6379: timed out; "
                                 "check that the cluster's head runs there and its Ray version is this one's")
    assert caught.value.exit_code == ExitCode.UNREACHABLE and isinstance(caught.value.__cause__, ConnectionError)
    assert refusing_ray == ["10.1.2.3:6379"]


def test_the_cluster_ray_address_names_is_the_one_reported(refusing_ray, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    with pytest.raises(OutsideSystemError, match=r"^Ray at ray://head:10001: Could not connect to the GCS at None"):
        runtime.connect(None)  # ray.init reads RAY_ADDRESS itself
    assert refusing_ray == [None]
