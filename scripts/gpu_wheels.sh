#!/usr/bin/env bash
# Wheels for the GPU check on a machine without PyPI (docs/gpu.md):
#   bash scripts/gpu_wheels.sh [PYTHON_VERSION] [--no-numpy]     # default 3.12
# Downloads into ./wheels (git-ignored: the device tool carries it when asked to) the x86-64 Linux
# wheels for that CPython of scripts/gpu_requirements.txt and everything they need, less what the
# check never imports (hf_xet: Hub downloads; typer and what it brings: command lines), and
# prints their size beside the working tree's (the device tool carries 60 MiB in all).
# --no-numpy where the machine's torch came with numpy.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-3.12}"
platforms=(--platform any --platform linux_x86_64 --platform manylinux2014_x86_64)
for minor in 17 24 26 27 28 31 34 35 36 38 39; do
    platforms+=(--platform "manylinux_2_${minor}_x86_64")
done
rm -rf wheels
python3 -m pip download -q -d wheels --only-binary=:all: --implementation cp --python-version "$version" \
    "${platforms[@]}" -r scripts/gpu_requirements.txt
for unused in hf_xet typer click rich pygments markdown_it_py mdurl shellingham; do
    rm -f wheels/"$unused"-*.whl
done
if [ "${2:-}" = "--no-numpy" ]; then
    rm -f wheels/numpy-*.whl
fi
echo "wheels: $(du -sh wheels | cut -f1) in $(ls wheels | wc -l) files; tracked tree: $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) bytes"
