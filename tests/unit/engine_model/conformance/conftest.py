"""Every conformance test that takes ``version`` runs once per engine version the model claims."""

from __future__ import annotations

import pytest
from conformance_harness import ENGINE_VERSIONS


@pytest.fixture(params=sorted(ENGINE_VERSIONS))
def version(request) -> str:
    return request.param
