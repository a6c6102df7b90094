#!/usr/bin/env bash
# Installs kvserve into the active Python environment.
#   bash scripts/install.sh          # the engine
#   bash scripts/install.sh test     # the engine plus the test extras
# A torch that is already installed (say a CUDA build) is kept. Without one, the CPU build of
# torch 2.13.0 is installed first, so that resolving kvserve's "torch>=2.4" never pulls a
# multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if ! python -c "import torch" >/dev/null 2>&1; then
    pip install "torch==2.13.0" || pip install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
fi
if [ -n "$extras" ]; then
    pip install -e ".[$extras]"
else
    pip install -e .
fi
# Build the C++ CPU kernels now (about a minute; into ~/.cache/kvserve/kernels/<this install>-<cpu>,
# a folder of this install's own) so that the first `kvserve serve` starts in seconds. A later
# build (sources changed, torch upgraded) says so on stderr. Without a compiler kvserve falls back
# to portable torch code.
python -c "from kvserve.kernels import cpu_kernels_available as ok; print('kvserve: CPU kernels', 'ready' if ok() else 'unavailable; using portable torch code')"
