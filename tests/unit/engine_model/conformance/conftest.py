"""Every conformance test that takes ``version`` runs once per engine version the model claims.

``@pytest.mark.builds_with("feature", ...)`` (on a test or its class) limits a test to the builds
whose ``EngineBuild`` has those features: an upstream test of a step a build does not have is not a
test of that build (SOURCES.md lists which build each upstream test applies to).
``@pytest.mark.builds_with(deadlock_stall_passes=lambda n: n > 1)`` tests a field by a predicate.
"""

from __future__ import annotations

from conformance_harness import ENGINE_VERSIONS


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "builds_with(*features, **predicates): engine builds a test applies to")


def _applies(build, markers) -> bool:
    for marker in markers:
        if not all(getattr(build, name) for name in marker.args):
            return False
        if not all(check(getattr(build, name)) for name, check in marker.kwargs.items()):
            return False
    return True


def pytest_generate_tests(metafunc) -> None:
    if "version" not in metafunc.fixturenames:
        return
    markers = list(metafunc.definition.iter_markers("builds_with"))
    versions = [v for v, build in sorted(ENGINE_VERSIONS.items()) if _applies(build, markers)]
    metafunc.parametrize("version", versions)
