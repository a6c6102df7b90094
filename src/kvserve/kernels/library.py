"""Finding, building and opening the kernels' shared library, and calling into it.

Where the library comes from, in order:
1. a wheel's prebuilt libraries, ``kvserve/kernels/lib/libkvserve_kernels_<variant>.so`` (every
   x86-64 variant; the best one this CPU runs is opened: :func:`kvserve.kernels.build.host_variant`);
2. this install's kernel cache, ``$XDG_CACHE_HOME/kvserve/kernels/<hash of the package path>/<variant>``
   (default ``~/.cache``), where a source install builds its CPU's variant on first use (a folder
   of each install's own, so two installs never rebuild each other's). A build is announced on
   stderr when it starts, with a line per compiled unit, and when it ends; a stamp of the sources
   and flags tells when the cached library is out of date.

The library is opened with ``ctypes.PyDLL`` (calls hold the GIL, as a C extension's would; a
whole forward releases it, :data:`RELEASES_GIL`) after
``import torch``, so its ``libgomp.so.1`` is the one torch loaded. Every entry point is declared in
:data:`PROTOTYPES`; :meth:`Library.call` raises ``RuntimeError`` with the kernel's message when one
fails. The kernels use as many threads as torch (``torch.get_num_threads()``), passed on before a
call whenever it changed.

The user's AMX switch, ``KVSERVE_AMX=0`` (every kernel keeps its vector path), is read here and
nowhere else (:func:`amx_allowed`), and passed to each library as it opens
(``kvserve_set_amx_enabled``; the instruction-set rule: :mod:`kvserve.kernels.build`).

Several variant libraries may be open in one process (the tests open every one this CPU runs,
:func:`kvserve.kernels.kernels_for_variant`): ctypes opens each with ``RTLD_LOCAL`` and the
library hides everything but its entry points, so each keeps its own code, settings and worker
pool.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch

from kvserve.kernels import build

ABI_VERSION = 10
PACKAGED = Path(__file__).parent / "lib"

# torch dtype -> the kernels' code (csrc/abi.h: DType).
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.int8: 3, torch.float8_e4m3fn: 4,
               torch.float8_e5m2: 5}

_P, _I64, _I32, _F32, _F64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_float, ctypes.c_double
_INT = ctypes.c_int
# name -> (result type, argument types), as csrc/*.cpp define them (`extern "C"`).
PROTOTYPES: dict[str, tuple[object, list]] = {
    "kvserve_last_error": (ctypes.c_char_p, []),
    "kvserve_abi_version": (_I64, []),
    "kvserve_variant": (ctypes.c_char_p, []),
    "kvserve_set_num_threads": (None, [_I64]),
    "kvserve_num_threads": (_I64, []),
    "kvserve_set_pool_enabled": (None, [_I32]),
    "kvserve_pool_enabled": (_I32, []),
    "kvserve_set_pool_spin_us": (None, [_I64]),
    "kvserve_pool_spin_us": (_I64, []),
    "kvserve_pool_self_check": (_INT, [_I64, _I64, _I64, _I64, _P]),
    "kvserve_set_amx_enabled": (None, [_I32]),
    "kvserve_amx_linear_available": (_I32, []),
    "kvserve_paged_attention": (_INT, [_P, _P, _I32, _P, _I32, _P, _P, _P] + [_I64] * 8 + [_F64, _I64, _I64, _I64, _F64,
                                                                                        _P]),
    "kvserve_latent_attention": (_INT, [_P, _P, _I32, _P, _P, _P, _P] + [_I64] * 8),
    "kvserve_write_kv_cache": (_INT, [_P, _I64, _I64, _P, _I64, _I64, _I64, _I64, _I64, _I64, _P, _I64, _P]),
    "kvserve_argmax_rows": (_INT, [_I32, _P, _I64, _I64, _P]),
    "kvserve_sample_rows": (_INT, [_I32, _P, _I64, _I64, _P, _I64, _P, _P, _P]),
    "kvserve_top_p_rows": (_INT, [_I32, _P, _I64, _I64, _P, _I64, _P, _P]),
    "kvserve_silu_and_mul": (_INT, [_I32, _P, _P, _I64, _I64]),
    "kvserve_sigmoid": (_INT, [_I32, _P, _P, _I64]),
    "kvserve_softmax_prefix_rows": (_INT, [_P, _P, _I64, _I64]),
    "kvserve_rotary_embedding": (_INT, [_P, _I64, _I64, _P, _P, _P, _I64, _I64, _I64]),
    "kvserve_rms_norm": (_INT, [_I32, _P, _I64, _P, _P, _P, _P, _I64, _I64, _F64]),
    "kvserve_linear_panel_width": (_I64, []),
    "kvserve_pack_linear_weight": (_INT, [_I32, _P, _P, _I64, _I64]),
    "kvserve_invariant_linear": (_INT, [_I32, _P, _I32, _P, _P, _P, _I64, _I64, _I64]),
    "kvserve_amx_linear": (_INT, [_P, _P, _P, _P, _I64, _I64, _I64, _I32]),
    "kvserve_quant_linear_isa": (_I64, []),
    "kvserve_quant_linear_layout": (_INT, [_P]),
    "kvserve_quant_linear": (_INT, [_I32, _P, _P, _I64, _I64, _P, _P, _P, _P, _I64, _I64, _I64, _I64]),
    "kvserve_amx_quant_linear": (_INT, [_P, _P, _I64, _I64, _P, _P, _P, _P, _I64, _I64, _I64, _I64]),
    "kvserve_apply_token_bitmask": (_INT, [_P, _I64, _I64, _I64, _P, _I64, _I64, _P, _I64]),
    "kvserve_lora_apply": (_INT, [_I32, _I32, _P, _P, _P, _P, _P, _P, _P, _P] + [_I64] * 9),
    "kvserve_decoder_create": (_INT, [_I32, _I64, _I64, _I64, _I64, _F64, _F64, _I64, _I64, _P, _I64, _P]),
    "kvserve_decoder_destroy": (None, [_P]),
    "kvserve_decoder_add_layer": (_INT, [_P, _I64, _P, _P, _P, _P, _P, _P, _P]),
    "kvserve_moe_create": (_INT, [_I64, _I64, _I64, _I64, _I64, _I64, _I32, _I32, _I32, _I32, _F32, _F32, _P, _P, _P,
                                  _P, _P, _P, _I32, _P]),
    "kvserve_moe_destroy": (None, [_P]),
    "kvserve_moe_forward": (_INT, [_P, _I32, _P, _P, _I64]),
    "kvserve_moe_forward_routed": (_INT, [_P, _I32, _P, _P, _P, _P, _I64]),
    "kvserve_moe_route": (_INT, [_I32, _P, _I64, _I64, _I64, _I32, _I32, _P, _P]),
    "kvserve_decoder_forward": (_INT, [_P, _P, _P, _I64, _P, _P, _P, _I64, _P, _P, _P, _P, _I64, _I64, _I64, _I64]),
}


# Entry points that run without the GIL (ctypes.CDLL): a whole forward, and the pool's self-check,
# which the tests run from several threads at once.
RELEASES_GIL = frozenset({"kvserve_decoder_forward", "kvserve_pool_self_check"})


def amx_allowed() -> bool:
    """The user's AMX switch: False when ``KVSERVE_AMX=0`` (the AMX kernels never run; the per-layer
    ``amx=`` arguments then cannot insist on them), else True (where the CPU and OS grant the tiles).
    Read when a library opens, and only here."""
    return os.environ.get("KVSERVE_AMX") != "0"


class Library:
    """The opened library: ``lib.fn`` for each entry point of :data:`PROTOTYPES`, and
    :meth:`call` for the ones that return a status. AMX follows :func:`amx_allowed`.

    Raises:
        RuntimeError: the library was built for another ABI version (an old build).
    """

    def __init__(self, path: Path):
        self.path = path
        self._dll = ctypes.PyDLL(str(path))
        self._dll.kvserve_abi_version.restype = _I64
        abi = self._dll.kvserve_abi_version()  # before the prototypes: an old library may lack some
        if abi != ABI_VERSION:
            raise RuntimeError(f"{path} has ABI version {abi}, this kvserve needs {ABI_VERSION}")
        without_gil = ctypes.CDLL(str(path))
        for name, (restype, argtypes) in PROTOTYPES.items():
            function = getattr(without_gil if name in RELEASES_GIL else self._dll, name)
            function.restype, function.argtypes = restype, argtypes
            setattr(self, name.removeprefix("kvserve_"), function)
            setattr(self, name, function)
        self.variant = self._dll.kvserve_variant().decode()
        self.set_amx_enabled(int(amx_allowed()))
        self._threads = 0

    def call(self, name: str, *args) -> None:
        """Run entry point ``name`` (one that returns a status) with torch's thread count.

        Raises:
            RuntimeError: the kernel failed (its message).
        """
        threads = torch.get_num_threads()
        if threads != self._threads:
            self.set_num_threads(threads)
            self._threads = threads
        if getattr(self, name)(*args) != 0:
            raise RuntimeError(self.last_error().decode())


def build_directory() -> Path:
    """Where this install builds (or finds) its CPU's variant: ``cache_root() / <variant>``."""
    return build.cache_root() / build.host_variant().name


def open_library(variant: build.Variant | None = None) -> Library:
    """The prebuilt library of a wheel for ``variant`` (default: this CPU's,
    :func:`kvserve.kernels.build.host_variant`), else this install's cached build of it (module
    docstring).

    Raises:
        RuntimeError: no compiler, a unit that does not compile, an old library.
    """
    variant = variant or build.host_variant()
    prebuilt = PACKAGED / build.library_name(variant.name)
    return Library(prebuilt if prebuilt.exists() else build.cached_library(variant))
