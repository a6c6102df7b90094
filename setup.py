"""Wheels carry the C++ kernels prebuilt: ``pip wheel .`` / ``python -m build`` compile every x86-64
instruction-set variant (``src/kvserve/kernels/build.py``: VARIANTS; one this tree's install built
already is copied from its cache) into ``kvserve/kernels/lib/``, and kvserve opens the best one the
CPU runs, so ``pip install kvserve-*.whl`` then ``kvserve serve`` never compiles. The libraries
depend on no Python or PyTorch version (ctypes), hence the ``py3-none-<platform>`` tag. An editable
or source install (``scripts/install.sh``) builds only its own CPU's variant, on first use. The
project's metadata lives in pyproject.toml.
"""

import importlib.util
import os
import platform
import shutil
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py


def _kernel_build():
    """src/kvserve/kernels/build.py, loaded by path (it imports only the standard library)."""
    path = Path(__file__).parent / "src" / "kvserve" / "kernels" / "build.py"
    spec = importlib.util.spec_from_file_location("kvserve_kernel_build", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class BuildPyWithKernels(build_py):
    """build_py, then every variant's library into the wheel's kvserve/kernels/lib/
    (``KVSERVE_WHEEL_VARIANTS=avx2,avx512``: only those; ``none``: none)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False) or platform.machine() not in ("x86_64", "AMD64"):
            return
        kernels = _kernel_build()
        names = os.environ.get("KVSERVE_WHEEL_VARIANTS", "").strip()
        if names == "none":
            return
        variants = kernels.variants_named(names.split(",")) if names else list(kernels.VARIANTS)
        out = Path(self.build_lib) / "kvserve" / "kernels" / "lib"
        shutil.rmtree(out, ignore_errors=True)  # no library of an earlier build's variants
        kernels.main(["--variant", *(v.name for v in variants), "--out", str(out)])


class BinaryDistribution(Distribution):
    """A distribution with binaries (the kernels' libraries): platform-specific, installed as such."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """A platform wheel for any Python 3 (the libraries use no Python API)."""

    def get_tag(self):
        return "py3", "none", super().get_tag()[2]


setup(distclass=BinaryDistribution, cmdclass={"build_py": BuildPyWithKernels, "bdist_wheel": PlatformWheel})
