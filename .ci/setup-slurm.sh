#!/usr/bin/env bash
# The single-node SLURM that tests/workflow/test_slurm.py starts: Debian/Ubuntu packages, as root.
# Idempotent: does nothing when every package is already installed. Installs no config
# and starts no service the test relies on (it writes its own slurm.conf and munge key
# in a temporary folder and runs its own daemons).
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client munge)

missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if [ "${#missing[@]}" -eq 0 ]; then
    echo "setup-slurm: ${PACKAGES[*]} already installed"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
echo "setup-slurm: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends "${PACKAGES[@]}"
