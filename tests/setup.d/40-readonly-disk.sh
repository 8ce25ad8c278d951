#!/usr/bin/env bash
# Tools of the read-only disk fault test (tests/reliability/test_faults_disk.py): an ext4 image on a
# loop device (mkfs.ext4 from e2fsprogs, mount/findmnt/losetup from mount and util-linux). All are
# in a standard Debian install; this only puts back what a slimmed image left out.
# Idempotent: nothing happens when every tool is there.
set -euo pipefail
missing=()
command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
command -v mount >/dev/null || missing+=(mount)
command -v findmnt >/dev/null || missing+=(util-linux)
if [ ${#missing[@]} -eq 0 ]; then
  echo "[readonly-disk] mkfs.ext4, mount and findmnt present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "[readonly-disk] installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
