"""The kernels' build (``kvserve.kernels.build``) and where the library comes from
(``kvserve.kernels.library``): a folder of each install's own, per instruction-set variant; a build
announced with a line per unit; a wheel's prebuilt library taken first; the variant chosen from the
CPU's flags; every variant a real library with no PyTorch in it."""

from __future__ import annotations

import hashlib
import subprocess
import threading
from pathlib import Path

import pytest
import torch

from kvserve.kernels import build, cpu_kernels, cpu_kernels_available, kernels_for_variant, library

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")


@pytest.fixture
def fake_build(monkeypatch, tmp_path):
    """``build_library`` replaced by a recorder that writes an empty library (no compiler run),
    in a fresh cache folder."""
    calls = []

    def build_library(variant, directory, *, log=None, jobs=None):
        calls.append((variant.name, directory))
        log(f"kvserve: [1/1] {variant.name} fake.cpp 0.0 s")
        target = directory / build.library_name(variant.name)
        target.write_bytes(b"")
        return target

    monkeypatch.setattr(build, "build_library", build_library)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return calls


def test_build_directory_is_keyed_by_install_path_and_variant(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    package = str(Path(library.__file__).resolve().parent)
    expected = tmp_path / "kvserve" / "kernels" / hashlib.sha256(package.encode()).hexdigest()[:12]
    assert build.cache_root() == expected
    assert library.build_directory() == expected / build.host_variant().name


def test_a_build_is_announced_with_its_units_then_loads_quietly(fake_build, capsys):
    directory = library.build_directory()
    assert build.cached_library() == directory / build.library_name(build.host_variant().name)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"kvserve: building the C++ CPU kernels ({build.host_variant().name}) in {directory}")
    assert err[1].startswith("kvserve: [1/1] ") and err[2].startswith("kvserve: CPU kernels built in ") and len(err) == 3
    assert build.cached_library() and capsys.readouterr().err == ""  # a second start: up to date
    (directory / "kvserve_build_stamp").write_text("sources changed")  # e.g. an upgrade
    build.cached_library()
    assert "building the C++ CPU kernels" in capsys.readouterr().err and len(fake_build) == 2


def test_a_damaged_library_is_built_again_and_an_intact_one_is_found_read_only(fake_build, capsys):
    directory = build.cached_library().parent
    library_file = directory / build.library_name(build.host_variant().name)
    library_file.write_bytes(b"\x7fELF truncated")  # not the file the build wrote: mapping it could crash
    build.cached_library()
    assert "building the C++ CPU kernels" in capsys.readouterr().err and len(fake_build) == 2
    (directory / "kvserve_build.flock").unlink()
    directory.chmod(0o555)  # a cache this user may not write: an up-to-date library needs no lock
    try:
        assert build.cached_library() == library_file and len(fake_build) == 2
        assert not (directory / "kvserve_build.flock").exists()  # nothing written (root may write anyway)
    finally:
        directory.chmod(0o755)


def test_no_compiler_is_said_without_announcing_a_build(fake_build, monkeypatch, capsys):
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="no C\+\+ compiler"):
        build.cached_library()
    assert capsys.readouterr().err == "" and fake_build == []


def test_a_second_build_in_the_same_folder_waits_for_the_first(fake_build):
    import fcntl

    directory = library.build_directory()
    directory.mkdir(parents=True)
    guard = open(directory / "kvserve_build.flock", "w")  # another process is building here
    fcntl.flock(guard, fcntl.LOCK_EX)
    done = threading.Event()
    threading.Thread(target=lambda: (build.cached_library(), done.set()), daemon=True).start()
    assert not done.wait(0.5) and fake_build == []
    fcntl.flock(guard, fcntl.LOCK_UN)
    guard.close()
    assert done.wait(10) and len(fake_build) == 1


def test_a_wheels_build_takes_the_up_to_date_cached_library_and_builds_the_rest(fake_build, tmp_path, capsys):
    """``--out`` (setup.py's wheel build): a variant built already from these sources is copied from
    the install's cache; one whose cached library is out of date is compiled."""
    host = build.host_variant().name
    cached = build.cached_library()
    cached.write_bytes(b"library")
    (cached.parent / "kvserve_build_stamp").write_text(f"{build.build_stamp(build.host_variant())}\n"
                                                       f"{hashlib.sha256(b'library').hexdigest()}\n")
    out = tmp_path / "wheel-lib"
    assert build.main(["--variant", host, "--out", str(out)]) == 0
    assert (out / build.library_name(host)).read_bytes() == b"library" and len(fake_build) == 1
    assert "the up-to-date library of this install's cache" in capsys.readouterr().err
    (cached.parent / "kvserve_build_stamp").write_text("sources changed")
    assert build.main(["--variant", host, "--out", str(out)]) == 0
    assert len(fake_build) == 2 and fake_build[1][1] != cached.parent  # built in a folder of its own


def test_a_wheels_prebuilt_library_is_opened_without_a_build(monkeypatch, tmp_path, fake_build):
    prebuilt = tmp_path / "lib"
    prebuilt.mkdir()
    real = cpu_kernels().path
    (prebuilt / build.library_name(build.host_variant().name)).write_bytes(real.read_bytes())
    monkeypatch.setattr(library, "PACKAGED", prebuilt)
    opened = library.open_library()
    assert opened.path.parent == prebuilt and fake_build == []


@pytest.mark.parametrize(("flags", "best"), [
    (set(), "x86_64"),
    ({"avx2", "fma", "f16c", "bmi2"}, "avx2"),
    ({"avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"}, "avx512"),
    ({"avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd", "avx512_bf16",
      "amx_tile", "amx_bf16"}, "avx512_bf16"),
])
def test_the_variant_is_the_best_the_cpu_runs(monkeypatch, flags, best):
    monkeypatch.setattr(build.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.delenv("KVSERVE_KERNEL_VARIANT", raising=False)
    assert build.host_variant().name == best
    monkeypatch.setenv("KVSERVE_KERNEL_VARIANT", "x86_64")
    assert build.host_variant().name == "x86_64"
    if best == "avx2":
        monkeypatch.setenv("KVSERVE_KERNEL_VARIANT", "avx512")
        with pytest.raises(RuntimeError, match="this CPU runs avx2, x86_64"):
            build.host_variant()


def test_a_variant_this_cpu_does_not_run_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(build, "host_variants", lambda: [build.VARIANTS[0]])
    with pytest.raises(RuntimeError, match="variant avx2: this CPU runs x86_64"):
        kernels_for_variant("avx2")


def test_the_amx_switch_is_read_in_python_and_passed_to_the_library():
    """``KVSERVE_AMX=0`` is read when a library opens (``library.amx_allowed``; the C++ code reads
    no environment) and reaches it through ``kvserve_set_amx_enabled``: no AMX kernel then."""
    import os
    import sys

    code = "from kvserve.kernels import cpu_kernels; k = cpu_kernels(); print(k.variant, int(k.amx_linear_available()))"
    env = {**os.environ, "KVSERVE_AMX": "0"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.stdout.split() == [cpu_kernels().variant, "0"], result.stderr[-2000:]
    kernels = cpu_kernels()
    before = kernels.amx_linear_available()
    kernels._lib.set_amx_enabled(0)
    try:
        assert not kernels.amx_linear_available()
    finally:
        kernels._lib.set_amx_enabled(int(library.amx_allowed()))
    assert kernels.amx_linear_available() == before


def test_a_unit_that_does_not_compile_names_itself(monkeypatch, tmp_path):
    monkeypatch.setattr(build, "SOURCES", ("broken.cpp",))
    monkeypatch.setattr(build, "CSRC", tmp_path)
    (tmp_path / "broken.cpp").write_text("int f( {\n")
    with pytest.raises(RuntimeError, match="broken.cpp failed to compile"):
        build.build_library(build.VARIANTS[0], tmp_path / "out")


@pytest.mark.slow
def test_every_variant_this_cpu_runs_builds_without_torch_and_computes_the_same():
    """Each variant (the wheel's libraries) compiled (this install's cached build, the one the
    per-variant tests open), linked against no PyTorch or Python library, and run here: greedy
    argmax and the invariant linear give torch's results."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 1000, generator=generator)
    weight = torch.randn(24, 40, generator=generator)
    x = torch.randn(3, 40, generator=generator)
    for variant in build.host_variants():
        kernels = kernels_for_variant(variant.name)
        needed = subprocess.run(["readelf", "-d", str(kernels.path)], capture_output=True, text=True).stdout
        assert "torch" not in needed and "python" not in needed.lower(), needed
        assert kernels.variant == variant.name
        assert torch.equal(kernels.argmax_rows(logits), logits.argmax(-1))
        out = kernels.invariant_linear(x, kernels.pack_linear_weight(weight), None, 24)
        torch.testing.assert_close(out, x @ weight.T, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_an_avx2_host_passes_the_fused_decoder_and_attention_suites():
    """The avx2 variant (what a host without AVX-512 runs: no AMX, the AVX2 and portable vector
    paths) through the fused-decoder, attention and sampling-kernel suites, in a process of its
    own (the variant is chosen when the library opens). On a host whose own variant is avx2 the
    whole suite has just run on it: nothing more to run."""
    if "avx2" not in [v.name for v in build.host_variants()]:
        pytest.skip("this CPU does not run AVX2")
    if cpu_kernels().variant == "avx2":
        return
    import os
    import sys

    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "KVSERVE_KERNEL_VARIANT": "avx2"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(tests / "model" / "test_fused_decoder.py"), str(tests / "attention" / "test_cpu_paged.py"),
                             str(tests / "sample" / "test_sample_kernel.py")],
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:]
