#!/usr/bin/env bash
# Installs kvserve into the active Python environment (an editable install of this checkout).
#   bash scripts/install.sh          # the engine
#   bash scripts/install.sh test     # the engine plus the test extras
# A torch that is already installed (say a CUDA build) is kept. Without one, the CPU build of
# torch 2.13.0 is installed first, so that resolving kvserve's "torch>=2.4" never pulls a
# multi-GB CUDA build. xgrammar is installed without its dependencies: it requires triton
# (~1 GB), which only its GPU kernel uses. The C++ CPU kernels (plain C++, no torch needed) build
# meanwhile, in the background, into this install's own cache folder, so that the first
# `kvserve serve` starts in seconds; without a compiler kvserve falls back to portable torch code.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python src/kvserve/kernels/build.py &
kernels=$!
if ! python -c "import torch" >/dev/null 2>&1; then
    pip install --no-compile "torch==2.13.0" || pip install --no-compile "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
fi
pip install --no-compile -e ".${extras:+[$extras]}"
pip install --no-compile --no-deps "xgrammar>=0.2.9" "apache-tvm-ffi>=0.1.11"
if wait "$kernels"; then
    echo "kvserve: CPU kernels ready"
else
    echo "kvserve: CPU kernels unavailable (no compiler?); kvserve will use portable torch code"
fi
