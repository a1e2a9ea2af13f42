#!/usr/bin/env bash
# Install autopar and what it needs into the current Python environment.
#   bash scripts/install.sh        the package
#   bash scripts/install.sh test   the package and its test extras
# torch first: with no torch present, the package's own "torch>=..." requirement would pull the
# newest CUDA build (several GB). torch==2.13.0 is the CPU build on these machines; on a GPU
# machine install the torch you want before running this script and it is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "autopar install: no torch found, installing torch==2.13.0"
  "$PY" -m pip install -q "torch==2.13.0"
fi
extra=""
[ "${1:-}" = "test" ] && extra="[test]"
# the test extras hold deepspeed, an sdist: build none of its CUDA ops (it compiles them on first
# use, which the tests never make)
DS_BUILD_OPS=0 "$PY" -m pip install -q -e ".${extra}"
# the tests run the frameworks' own code on autopar's exports: Megatron-LM's argument checks ship
# in the megatron-core wheel (Python 3.12 only, its argument code pure Python), unpacked, not
# installed (scripts/fetch_frameworks.py); megatron-bridge's likewise, and what it imports beyond
# this environment installed into a folder of its own there (it pins an older transformers)
[ "${1:-}" = "test" ] && "$PY" scripts/fetch_frameworks.py
exit 0
