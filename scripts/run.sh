#!/usr/bin/env bash
# The README's main command: builds what is missing, prints the capability table, and runs
# the demo: reserve, map, grow a mapping, share it with a child process. On the GPU when
# there is one, otherwise on the OS host-memory provider.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
vmm_prepare build >/dev/null
build/vmm/vmm-info
build/samples/grow_and_share
