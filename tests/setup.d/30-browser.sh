#!/usr/bin/env bash
# Debian's Chromium for the real-browser tests of the notebook front end (tests/e2e/).
# Playwright (a pip package of the test extras) drives it through executable_path=/usr/bin/chromium;
# its own browser download (`playwright install`) cannot work here and is never run.
# Idempotent: nothing happens when /usr/bin/chromium exists.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  echo "[browser] chromium present: $(/usr/bin/chromium --version 2>/dev/null | head -1)"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "[browser] installing Debian's chromium"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium
/usr/bin/chromium --version
