#!/usr/bin/env bash
# The GPU check (docs/gpu.md): bash scripts/gpu_check.sh [--dry-run] [--out FILE]
# On a GPU machine whose python3 has CUDA torch and Triton: installs kvserve without touching
# torch (pip --no-deps for kvserve itself, its other dependencies from PyPI or, offline, from
# ./wheels), then runs scripts/gpu_check.py. --dry-run: the same on the CPU with tiny shapes (CI).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import kvserve" 2>/dev/null; then
    find_links=()
    [ -d wheels ] && find_links=(--no-index --find-links wheels)
    python3 -m pip install -q "${find_links[@]}" fastapi "uvicorn[standard]" pydantic prometheus-client \
        transformers tokenizers safetensors jinja2 pyzmq msgspec httpx numpy
    python3 -m pip install -q --no-deps --no-build-isolation -e .
fi
exec python3 scripts/gpu_check.py "$@"
