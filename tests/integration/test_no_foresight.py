"""No remediation policy may read what the real engine does not know: a request's actual output length.

The engine model must know each request's output (it decides when the request finishes); TensorRT-LLM
only knows ``max_new_tokens``, the client's cap. These tests replay with every policy attached while
the model's requests guard ``output_len``: a read from kvscope's side (remediation, the engine
binding, the composition root) is recorded, and any one fails the test. The model's own reads
(the executor, the forward pass) stay allowed.
"""

from __future__ import annotations

import sys

import pytest

from kvscope import replay
from kvscope.app import remedy
from kvscope.app.remediation_setting import parse_remediation_setting
from kvscope.engine_model import executor as executor_module
from kvscope.engine_model.executor import client_output_limits
from kvscope.engine_model.request import LlmRequestModel
from kvscope.engines import gate
from remediation import POLICIES

KVSCOPE_SIDE = ("remediation", "kvscope.engines", "kvscope.app", "kvscope.port", "kvscope.analysis")


class GuardedRequest(LlmRequestModel):
    """An engine-model request whose ``output_len`` notes every reader outside the engine model."""

    readers: list[str] = []

    @property  # type: ignore[override]
    def output_len(self) -> int:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith(KVSCOPE_SIDE):
            GuardedRequest.readers.append(caller)
        return self._output_len

    @output_len.setter
    def output_len(self, value: int) -> None:
        self._output_len = value


@pytest.fixture
def guarded(monkeypatch):
    GuardedRequest.readers = []
    monkeypatch.setattr(executor_module, "LlmRequestModel", GuardedRequest)
    return GuardedRequest.readers


CASES = [("shared-prefix", []), ("qwen-hybrid-mtp", []),
         ("glm5-dsa", ["max_requests=64", "session_start_interval_s=-1"])]


@pytest.mark.parametrize("policy", [*POLICIES, "auto"])
@pytest.mark.parametrize(("scenario", "overrides"), CASES, ids=[c[0] for c in CASES])
def test_no_policy_reads_a_requests_actual_output_length(guarded, scenario, overrides, policy):
    mode, policy_name = parse_remediation_setting(policy)
    session = remedy.RemediatedSession(mode=mode, policy=policy_name, label=scenario)
    summary = replay.run(scenario, overrides, instrument=session)
    assert summary.requests_completed > 0  # the guard was in the loop for a whole replay
    assert session.controller is not None
    assert guarded == [], f"{policy} on {scenario}: output_len read by {sorted(set(guarded))}"


def test_the_guard_catches_a_reader_on_kvscopes_side(guarded, monkeypatch):
    # The guard itself must fail a policy that peeks: a gate that reads output_len once per attempt
    # (defined in the gate's module namespace, as a leak there would be).
    namespace = {"__name__": gate.__name__, "real": gate.admission_request}
    exec("def peeking(req):\n    _ = req.output_len\n    return real(req)\n", namespace)  # noqa: S102
    monkeypatch.setattr(gate, "admission_request", namespace["peeking"])
    replay.run("shared-prefix", ["max_requests=4"], instrument=remedy.RemediatedSession(mode="on"))
    assert guarded and set(guarded) == {"kvscope.engines.gate"}


def test_admission_sees_the_clients_cap_never_the_output():
    # A request that will generate 300 tokens, from a client that sent no max_tokens (TensorRT-LLM then
    # deduces max_seq_len - prompt) and from one that sent 4,096.
    for client, cap in (("none", 262_144 - 1_000), ("4096", 4_096)):
        max_new_tokens, output_len = client_output_limits(client, 1_000, 300, 262_144)
        request = LlmRequestModel(1, 1_000, output_len, (), max_new_tokens=max_new_tokens)
        seen = gate.admission_request(request)
        assert (seen.max_new_tokens, output_len) == (cap, 300)
        assert 300 not in (seen.prompt_len, seen.max_new_tokens, seen.context_position, seen.num_tokens)
    # "actual" is the foresight comparison row, and only it hands admission the output.
    assert client_output_limits("actual", 1_000, 300, 262_144) == (300, 300)
