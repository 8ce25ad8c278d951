"""The live transport owns its defaults and stays importable without pyzmq (the optional ``live``
extra): ``kvscope-instrument`` reads the default endpoint from it, and only opening a socket needs
the library."""

from __future__ import annotations

import subprocess
import sys

WITHOUT_PYZMQ = """
import sys
sys.modules["zmq"] = None  # as if pyzmq were not installed
from kvscope.app.launcher import check_env
from kvscope.engines.live import DEFAULT_ZMQ_ENDPOINT, LiveSubscriber
print(DEFAULT_ZMQ_ENDPOINT, check_env({"KVSCOPE_SINKS": "zmq"}))
try:
    LiveSubscriber()
except ModuleNotFoundError as e:
    print(e.name)
"""


def test_the_launcher_reads_the_default_endpoint_and_a_socket_names_pyzmq_when_pyzmq_is_missing():
    done = subprocess.run([sys.executable, "-c", WITHOUT_PYZMQ], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["tcp://127.0.0.1:5557 []", "zmq"]
