"""What an OTLP exporter met, said in a few words for the command's one error or warning line.

The OpenTelemetry SDK logs a failed export as a long line written for a retry still to come
("Transient error StatusCode.UNAVAILABLE encountered while exporting metrics to host:4317, retrying
in 1.05s. Error details: ..."), or, when the timeout is shorter than its first back-off, only
"due to timeout, max retries or shutdown". Once the command has given up, nothing is retried: these
helpers drop the retry note and name the cause (connection refused, host not found, an HTTP status),
asking the network itself (:func:`probe`) when the SDK's words do not say.
"""

from __future__ import annotations

import re
import socket
from urllib.parse import urlsplit

_RETRY_NOTE = re.compile(r",?\s*retrying in [0-9.]+\s*s\.?", re.IGNORECASE)
_GRPC_STATUS = re.compile(r"StatusCode\.([A-Z_]+)")
_HTTP_STATUS = re.compile(r"code: (\d{3}), reason: (.*)$")

_CAUSES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("connection refused",), "connection refused"),
    (("name or service not known", "domain name not found", "nameresolutionerror", "lookup failed",
      "temporary failure in name resolution", "nodename nor servname"), "host not found"),
    (("deadline", "timed out", "timeout"), "no success within the timeout"),
    (("failed parsing http/2", "expected settings frame"), "not a gRPC endpoint"),
    (("certificate", "ssl", "tls"), "TLS failure"),
    (("connection reset", "connection aborted", "remotedisconnected"), "connection reset"),
)


def without_retry_note(message: str) -> str:
    """``message`` without the SDK's "retrying in N s" (said of a retry that will not happen)."""
    return " ".join(_RETRY_NOTE.sub("", message).split())


def probe(endpoint: str, timeout_s: float) -> str | None:
    """Why a TCP connection to ``endpoint`` (``host:port`` or ``http(s)://host:port``) fails: "host
    not found", "connection refused", "no answer within S s" or the OS's words; None when it connects
    (or names no port: the exporters' own default then applies)."""
    try:
        parts = urlsplit(endpoint if "://" in endpoint else f"//{endpoint}")
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host or not port:
        return None
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except socket.gaierror:
        return "host not found"
    except ConnectionRefusedError:
        return "connection refused"
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except OSError as e:
        return (e.strerror or str(e)).lower()


def failure_cause(message: str | None, *, unreachable: str | None = None) -> str:
    """A few words for why an export failed, from the SDK's first log line about it (or None) and
    what :func:`probe` found (``unreachable``, which wins: it is the network's own answer)."""
    if unreachable:
        grpc = _GRPC_STATUS.search(message or "")
        return f"{unreachable} / {grpc.group(1)}" if grpc else unreachable
    if not message:
        return "no answer: every export timed out or was still pending at exit"
    low = message.lower()
    http = _HTTP_STATUS.search(message)
    if http:
        return f"HTTP {http.group(1)} {http.group(2).strip()}: is it an OTLP receiver?"
    words = [w for keys, w in _CAUSES if any(k in low for k in keys)][:1]
    grpc = _GRPC_STATUS.search(message)
    if grpc:
        words.append(grpc.group(1))
    return " / ".join(words) if words else without_retry_note(message)[:200]
