"""The build of kvserve's C++ CPU kernels: one shared library per instruction-set variant.

The kernels (``csrc/*.cpp``) are plain C++ on raw pointers: no PyTorch or Python header, so a unit
compiles in about a second (with ``torch/extension.h`` each took ~20 s) and the library works with
any torch (Python calls it through ctypes, :mod:`kvserve.kernels.library`). Each unit is compiled
by its own ``g++`` process, as many at once as the process may use CPUs, and a line is printed as
each one ends. Objects are named by a digest of their source, the headers and the flags, so a
change rebuilds only what it touches.

The instruction-set rule, one for every kernel:

1. The vector instruction set is chosen once, when Python loads the library, by variant: one
   library per variant of :data:`VARIANTS`, the best one the CPU runs is loaded (ggml's CPU
   backend does the same). A wheel carries every variant (``setup.py`` builds them); a source
   install builds the variant of its own CPU on first use (:func:`host_variant`). Inside a library
   the code specialises only by the compiler's predefined macros (``__AVX512BF16__``,
   ``__AVX512F__``, ``__AVX2__`` / ``__FMA__``): no run-time CPU probe, no copy of a kernel per
   ``#pragma GCC target``, no instruction-set argument in the API. A packed weight layout that
   depends on the vector width (the quantized panels, ``csrc/quant_vector.h``) is the library's.
2. AMX is the one choice made at run time inside a library, since the OS must grant the tiles to
   the process: its code is compiled into avx512_bf16 only, under ``#pragma GCC target("amx-...")``;
   one probe (``csrc/amx_tiles.h``) says whether the tiles are granted, and the user's switch
   ``KVSERVE_AMX=0`` is read in Python only (:func:`kvserve.kernels.library.amx_allowed`) and
   passed in through one entry point (``kvserve_set_amx_enabled``).

Tests of "every instruction set this CPU runs" open each variant's library beside the loaded one
(:func:`kvserve.kernels.kernels_for_variant`, built into the cache on first use).

    python -m kvserve.kernels.build [--variant NAME ...] [--out DIR]   # build into DIR (default: the cache)

With ``--out`` (a wheel's build, ``setup.py``) a variant whose library in this install's cache is up
to date (the same stamp: sources, headers, flags, compiler) is copied from there, not compiled again.

Only the standard library is imported here, so ``scripts/install.sh`` runs this file as a script
(``python src/kvserve/kernels/build.py``) while pip installs the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"
SOURCES = ("abi.cpp", "thread_pool.cpp", "paged_attention.cpp", "paged_attention_portable.cpp",
           "paged_attention_bf16.cpp", "paged_attention_amx.cpp", "latent_attention.cpp", "argmax.cpp", "sample.cpp",
           "top_p.cpp", "elementwise.cpp", "linear.cpp", "amx_linear.cpp", "quant_linear.cpp", "amx_quant_linear.cpp",
           "amx_quant_tiles.cpp", "amx_quant_row.cpp", "bitmask.cpp", "lora.cpp", "projection.cpp", "moe_route.cpp",
           "moe.cpp", "moe_abi.cpp", "decoder.cpp")
COMMON_FLAGS = ("-std=c++17", "-O3", "-fPIC", "-fopenmp", "-ffast-math", "-fno-finite-math-only",
                "-fno-strict-aliasing", "-fvisibility=hidden")
LINK_FLAGS = ("-shared", "-fopenmp", "-static-libstdc++", "-static-libgcc")
PROGRESS_INTERVAL_S = 2.0  # a line at least this often while a build runs


class BuildInterrupted(RuntimeError):
    """A compiler was stopped by a signal (Ctrl-C in the terminal that started kvserve)."""


@dataclass(frozen=True)
class Variant:
    """An instruction-set variant: its name, the compiler flags, and the CPU flags
    (``/proc/cpuinfo``) a host needs to run it."""

    name: str
    flags: tuple[str, ...]
    needs: frozenset[str]


# Best last. AMX code is compiled into avx512_bf16 under `#pragma GCC target` and used where the
# CPU and the OS grant the tiles (every AMX CPU has AVX512-BF16). avx512_bf16 is tuned for
# Sapphire Rapids: on that 2-vCPU Xeon the batch-64 decode step took 0.97x the time of the
# generic tuning (68.2-68.8 against 69.4-70.8 ms, alternating; docs/benchmarks.md section 7.1).
VARIANTS: tuple[Variant, ...] = (
    Variant("x86_64", ("-march=x86-64", "-mtune=generic"), frozenset()),
    Variant("avx2", ("-march=x86-64-v3", "-mtune=generic"), frozenset({"avx2", "fma", "f16c", "bmi2"})),
    Variant("avx512", ("-march=x86-64-v4", "-mtune=generic"),
            frozenset({"avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"})),
    Variant("avx512_bf16", ("-march=x86-64-v4", "-mavx512bf16", "-mtune=sapphirerapids"),
            frozenset({"avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd",
                       "avx512_bf16"})),
)
NATIVE = Variant("native", ("-march=native",), frozenset())  # other architectures: this machine's own


def library_name(variant: str) -> str:
    return f"libkvserve_kernels_{variant}.so"


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as ``/proc/cpuinfo`` names them (empty where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def host_variants() -> list[Variant]:
    """The variants this CPU runs, best first (x86-64), or [NATIVE] on other architectures."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return [NATIVE]
    flags = cpu_flags()
    return [v for v in reversed(VARIANTS) if v.needs <= flags]


def host_variant() -> Variant:
    """The best variant for this CPU; ``KVSERVE_KERNEL_VARIANT`` names another it can run (tests
    of the AVX2 or AVX-512 builds on a newer host)."""
    runnable = host_variants()
    wanted = os.environ.get("KVSERVE_KERNEL_VARIANT", "").strip()
    if not wanted:
        return runnable[0]
    for variant in runnable:
        if variant.name == wanted:
            return variant
    raise RuntimeError(f"KVSERVE_KERNEL_VARIANT={wanted}: this CPU runs {', '.join(v.name for v in runnable)}")


def _sources_digest(variant: Variant, compiler: str) -> hashlib._Hash:
    digest = hashlib.sha256(" ".join((compiler, *COMMON_FLAGS, *variant.flags, *LINK_FLAGS)).encode())
    for path in sorted(CSRC.glob("*.h")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest


def build_stamp(variant: Variant) -> str:
    """A digest of everything the variant's library is built from (sources, headers, flags, the
    ``CXX`` asked for)."""
    digest = _sources_digest(variant, os.environ.get("CXX", ""))
    for name in SOURCES:
        digest.update(name.encode() + (CSRC / name).read_bytes())
    return digest.hexdigest()


def compiler() -> str:
    """The C++ compiler: ``$CXX``, else ``g++`` or ``c++`` on PATH."""
    for candidate in (os.environ.get("CXX"), "g++", "c++"):
        if candidate and shutil.which(candidate):
            return candidate
    raise RuntimeError("no C++ compiler (g++) on PATH")


def _compile(cxx: str, variant: Variant, source: str, directory: Path, headers: hashlib._Hash) -> tuple[Path, float]:
    digest = headers.copy()
    digest.update((CSRC / source).read_bytes())
    obj = directory / f"{Path(source).stem}-{digest.hexdigest()[:12]}.o"
    start = time.perf_counter()
    if not obj.exists():
        partial = obj.with_suffix(f".{os.getpid()}.tmp")
        command = [cxx, *COMMON_FLAGS, *variant.flags, f'-DKVSERVE_VARIANT="{variant.name}"', "-c",
                   str(CSRC / source), "-o", str(partial)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode < 0:
            partial.unlink(missing_ok=True)
            raise BuildInterrupted(f"the compiler of {source} was stopped by signal {-result.returncode}")
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"{source} failed to compile ({' '.join(command)}):\n{result.stderr[-4000:]}")
        partial.replace(obj)
    return obj, time.perf_counter() - start


def usable_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def build_library(variant: Variant, directory: Path, *, log=None, jobs: int | None = None) -> Path:
    """Compile ``SOURCES`` for ``variant`` in parallel into ``directory`` and link the library
    there (written under a temporary name and renamed, so a killed build never leaves a broken
    one). ``log(line)`` gets one line per unit and one for the link. Returns the library's path.

    Raises:
        RuntimeError: no compiler, or a unit that does not compile (with the compiler's message).
    """
    log = log or (lambda line: None)
    cxx = compiler()
    directory.mkdir(parents=True, exist_ok=True)
    for leftover in directory.glob("*.tmp"):  # of a build that was killed
        leftover.unlink(missing_ok=True)
    start = time.perf_counter()
    objects = _compile_all(cxx, variant, directory, jobs, log, start)
    target = directory / library_name(variant.name)
    try:
        _link(cxx, [objects[name] for name in SOURCES], target)
    except RuntimeError:  # a damaged object in the folder: compile every unit again, once
        for obj in objects.values():
            obj.unlink(missing_ok=True)
        objects = _compile_all(cxx, variant, directory, jobs, log, start)
        _link(cxx, [objects[name] for name in SOURCES], target)
    total = len(SOURCES) + 1
    log(f"kvserve: [{total}/{total}] {variant.name} linked in {time.perf_counter() - start:.1f} s")
    return target


def _compile_all(cxx: str, variant: Variant, directory: Path, jobs: int | None, log, start: float) -> dict[str, Path]:
    headers = _sources_digest(variant, cxx)
    objects: dict[str, Path] = {}
    total = len(SOURCES) + 1
    with ThreadPoolExecutor(max_workers=jobs or usable_cpus()) as pool:
        futures = {pool.submit(_compile, cxx, variant, name, directory, headers): name for name in SOURCES}
        pending = set(futures)
        try:
            while pending:
                finished, pending = wait(pending, timeout=PROGRESS_INTERVAL_S, return_when=FIRST_COMPLETED)
                if not finished:  # a long unit: say the build is alive
                    log(f"kvserve: [{len(objects)}/{total}] {variant.name} compiling ... "
                        f"{time.perf_counter() - start:.0f} s")
                for future in finished:
                    obj, seconds = future.result()
                    objects[futures[future]] = obj
                    log(f"kvserve: [{len(objects)}/{total}] {variant.name} {futures[future]} {seconds:.1f} s")
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)  # no more units after a failure or Ctrl-C
            raise
    return objects


def _link(cxx: str, objects: list[Path], target: Path) -> None:
    """The library from ``objects``, written under a temporary name and renamed (a killed link
    never leaves a broken library), readable and executable by everyone."""
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".tmp", delete=False) as tmp:
        partial = Path(tmp.name)
    result = subprocess.run([cxx, *LINK_FLAGS, "-o", str(partial), *map(str, objects)], capture_output=True, text=True)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        if result.returncode < 0:
            raise BuildInterrupted(f"the linker was stopped by signal {-result.returncode}")
        raise RuntimeError(f"linking {target.name} failed:\n{result.stderr[-4000:]}")
    partial.chmod(0o755)
    partial.replace(target)


def cache_root() -> Path:
    """This install's kernel cache: ``$XDG_CACHE_HOME/kvserve/kernels/<hash of the package path>``
    (default ``~/.cache``), a folder of each install's own, so two installs never rebuild each
    other's."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    install = hashlib.sha256(str(Path(__file__).resolve().parent).encode()).hexdigest()[:12]
    return cache / "kvserve" / "kernels" / install


@contextlib.contextmanager
def _build_guard(directory: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the build folder while a build or a load runs there: two processes
    starting at once build once (the second waits, then loads); the kernel releases the lock of a
    process that dies."""
    with open(directory / "kvserve_build.flock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _library_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _up_to_date(target: Path, stamp_file: Path, stamp: str) -> bool:
    """The library is there, was built from these sources and flags, and is the file that build
    wrote (its digest: a truncated or damaged library would crash the process that maps it)."""
    try:
        recorded = stamp_file.read_text().split()
        return recorded == [stamp, _library_digest(target)]
    except OSError:
        return False


def _cache_entry(variant: Variant) -> tuple[Path, Path, str]:
    """(the library's path in this install's cache, its stamp file, the stamp it must carry)."""
    directory = cache_root() / variant.name
    return directory / library_name(variant.name), directory / "kvserve_build_stamp", build_stamp(variant)


def cached_library(variant: Variant | None = None) -> Path:
    """This install's library for ``variant`` (default: this CPU's), built first when it is missing,
    out of date or damaged: announced on stderr, a line per unit, and the time it took. An up-to-date
    library is found without writing anything (a read-only cache works).

    Raises:
        RuntimeError: no compiler, a unit that does not compile; BuildInterrupted: Ctrl-C.
    """
    variant = variant or host_variant()
    target, stamp_file, stamp = _cache_entry(variant)
    directory = target.parent
    if _up_to_date(target, stamp_file, stamp):
        return target
    compiler()  # no compiler: say so before announcing a build
    directory.mkdir(parents=True, exist_ok=True)
    with _build_guard(directory):
        if _up_to_date(target, stamp_file, stamp):  # another process built it meanwhile
            return target
        _say(f"kvserve: building the C++ CPU kernels ({variant.name}) in {directory}, once per install and CPU ...")
        start = time.perf_counter()
        build_library(variant, directory, log=_say)
        stamp_file.write_text(f"{stamp}\n{_library_digest(target)}\n")
        _say(f"kvserve: CPU kernels built in {time.perf_counter() - start:.0f} s")
        return target


def variants_named(names: Sequence[str]) -> list[Variant]:
    known = {v.name: v for v in (*VARIANTS, NATIVE)}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n] for n in names]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvserve.kernels.build", description=__doc__.splitlines()[0])
    parser.add_argument("--variant", nargs="*", help="variants to build (default: this CPU's; 'all': every x86-64 one)")
    parser.add_argument("--out", type=Path, help="folder for the libraries (default: this install's kernel cache)")
    args = parser.parse_args(argv)
    if args.variant == ["all"]:
        variants = list(VARIANTS)
    else:
        variants = variants_named(args.variant) if args.variant else [host_variant()]
    try:
        for variant in variants:
            if args.out is None:
                cached_library(variant)
                continue
            args.out.mkdir(parents=True, exist_ok=True)
            cached, stamp_file, stamp = _cache_entry(variant)
            if _up_to_date(cached, stamp_file, stamp):  # this tree's sources and flags, built already
                _say(f"kvserve: {variant.name}: the up-to-date library of this install's cache ({cached})")
                shutil.copy2(cached, args.out / library_name(variant.name))
                continue
            with tempfile.TemporaryDirectory() as objects:
                shutil.copy2(build_library(variant, Path(objects), log=_say), args.out / library_name(variant.name))
    except RuntimeError as error:  # no compiler, a unit that does not compile: one message, no traceback
        _say(f"kvserve: the CPU kernels were not built: {error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
