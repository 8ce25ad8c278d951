#!/usr/bin/env bash
# Installs the real OpenTelemetry backends that tests/integration/ starts and stops:
#   rotel        OTLP collector (PyPI wheel bundling the rotel-agent binary), own venv
#   Phoenix      trace store (Arize Phoenix), own venv (keeps its ~150 deps out of .venv)
#   VictoriaMetrics 1.112 (Debian trixie .deb, unpacked): OTLP metrics store
#   Prometheus 2.42 + promtool (Debian bookworm .deb, unpacked): scraping and `promtool test rules`
# Everything lands under $KVSCOPE_OTEL_STACK (default <repo>/.cache/otel-stack); nothing system-wide.
# Idempotent: each part is skipped when its marker exists, so a second run takes well under a second.
# Adapted from ../shared/recipes/otel/install.sh (same components and versions).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
S=${KVSCOPE_OTEL_STACK:-$REPO/.cache/otel-stack}
PY=${KVSCOPE_STACK_PYTHON:-python3}
mkdir -p "$S"
log(){ echo "[otel-stack] $*"; }

# 1. rotel (collector)
if [ ! -f "$S/rotel-venv/.ok" ]; then
  log "installing rotel"; rm -rf "$S/rotel-venv"
  "$PY" -m venv "$S/rotel-venv" && "$S/rotel-venv/bin/pip" install -q --disable-pip-version-check rotel
  ls "$S"/rotel-venv/lib/python3*/site-packages/rotel/rotel-agent >/dev/null
  touch "$S/rotel-venv/.ok"
fi

# 2. Phoenix (trace store)
if [ ! -f "$S/phoenix-venv/.ok" ]; then
  log "installing arize-phoenix (about a minute)"; rm -rf "$S/phoenix-venv"
  "$PY" -m venv "$S/phoenix-venv" && "$S/phoenix-venv/bin/pip" install -q --disable-pip-version-check arize-phoenix
  touch "$S/phoenix-venv/.ok"
fi

# 3. Debian binaries, downloaded and unpacked only (a private apt config points at trixie for VictoriaMetrics)
if [ ! -f "$S/obs/.ok" ]; then
  log "downloading victoria-metrics (trixie) and prometheus (bookworm)"
  A=$S/apt-trixie; rm -rf "$A" "$S/debs" "$S/obs"
  mkdir -p "$A/etc" "$A/lists/partial" "$A/cache/archives/partial" "$S/debs" "$S/obs"
  URI=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  # Use the Debian mirror this machine is already configured with; never a hard-coded host.
  [ -n "$URI" ] || URI=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$URI" ] || { echo "[otel-stack] no Debian mirror configured in /etc/apt" >&2; exit 1; }
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $URI trixie main" > "$A/etc/sources.list"
  O=(-o "Dir::Etc::sourcelist=$A/etc/sources.list" -o Dir::Etc::sourceparts=- -o "Dir::State::Lists=$A/lists"
     -o "Dir::Cache=$A/cache" -o APT::Sandbox::User=root)
  apt-get "${O[@]}" update -qq
  ( cd "$S/debs" && apt-get "${O[@]}" download -qq victoria-metrics )
  if ! apt-cache show prometheus >/dev/null 2>&1; then apt-get update -qq; fi
  ( cd "$S/debs" && apt-get -o APT::Sandbox::User=root download -qq prometheus )
  dpkg-deb -x "$S"/debs/victoria-metrics_*.deb "$S/obs/vm"
  dpkg-deb -x "$S"/debs/prometheus_*.deb "$S/obs/prom"
  "$S/obs/vm/usr/bin/victoria-metrics" -version >/dev/null
  "$S/obs/prom/usr/bin/promtool" --version >/dev/null 2>&1
  touch "$S/obs/.ok"
fi
log "ready in $S"
