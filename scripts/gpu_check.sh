#!/usr/bin/env bash
# The GPU check (docs/gpu.md): bash scripts/gpu_check.sh [--dry-run] [--out FILE]
# On a GPU machine whose python3 has CUDA torch and Triton: installs kvserve without touching
# torch (pip --no-deps for kvserve itself; scripts/gpu_requirements.txt from PyPI or, offline, every
# wheel in ./wheels, made by scripts/gpu_wheels.sh), then runs scripts/gpu_check.py. --dry-run: the
# same on the CPU with tiny shapes (CI).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import kvserve" 2>/dev/null; then
    if [ -d wheels ]; then
        python3 -m pip install -q --no-index --no-deps wheels/*.whl
    else
        python3 -m pip install -q -r scripts/gpu_requirements.txt
    fi
    python3 -m pip install -q --no-deps --no-build-isolation -e .
fi
exec python3 scripts/gpu_check.py "$@"
