"""Fixtures of the storage tests: tiny models of several methods (the S3 server is in tests/conftest.py)."""
import pytest

from storage_cases import CASES, build_case


@pytest.fixture(params=CASES, ids=[case[0] for case in CASES])
def case(request):
    _, name, params, adapters = request.param
    method, model = build_case(name, params, adapters)
    return method, model, adapters
