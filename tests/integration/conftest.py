"""One real OpenTelemetry stack per test session (see otel_stack.py), stopped at the end."""

from __future__ import annotations

import pytest
from otel_stack import OtelStack


@pytest.fixture(scope="session")
def otel_stack(tmp_path_factory):
    stack = OtelStack(tmp_path_factory.mktemp("otel-stack"))
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()
