"""The C++ kernels build into a folder of this install's own, per CPU, and a build at run time is
announced on stderr when it starts and when it ends (a load of an up-to-date build says nothing)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import kvserve.kernels as kernels


@pytest.fixture
def fake_load(monkeypatch, tmp_path):
    """torch's ``load`` replaced by a recorder (no compiler run), a fresh cache folder, no memo."""
    import torch.utils.cpp_extension as cpp_extension

    calls = []

    class Module(str):
        def set_pool_enabled(self, enabled: bool) -> None:
            self.pool_enabled = enabled

    def load(**kwargs):
        calls.append(kwargs)
        return Module(f"module in {kwargs['build_directory']}")

    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    kernels.cpu_kernels.cache_clear()
    yield calls
    kernels.cpu_kernels.cache_clear()


def test_build_directory_is_keyed_by_install_path_and_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    package = str(Path(kernels.__file__).resolve().parent)
    expected = tmp_path / "kvserve" / "kernels" / f"{hashlib.sha256(package.encode()).hexdigest()[:12]}-{kernels.cpu_tag()}"
    assert kernels.build_directory() == expected


def test_a_build_is_announced_once_then_loads_quietly(fake_load, capsys):
    directory = kernels.build_directory()
    assert kernels.cpu_kernels() == f"module in {directory}"
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"kvserve: building the C++ CPU kernels in {directory} (once per install and CPU, "
                      "about a minute) ...")
    assert err[1].startswith("kvserve: CPU kernels built in ") and len(err) == 2
    assert fake_load[0]["build_directory"] == str(directory)
    assert fake_load[0]["sources"] == [str(kernels._CSRC / name) for name in kernels.SOURCES]
    kernels.cpu_kernels.cache_clear()  # a second process start: up to date, nothing printed
    assert kernels.cpu_kernels() == f"module in {directory}" and capsys.readouterr().err == ""
    (directory / "kvserve_build_stamp").write_text("sources changed")  # e.g. an upgrade
    kernels.cpu_kernels.cache_clear()
    kernels.cpu_kernels()
    assert "building the C++ CPU kernels" in capsys.readouterr().err


def test_a_lock_left_by_a_killed_build_is_removed_and_the_build_goes_on(fake_load):
    directory = kernels.build_directory()
    directory.mkdir(parents=True)
    (directory / "lock").touch()  # torch's marker of a build in progress, from a build that was killed
    assert kernels.cpu_kernels() == f"module in {directory}"
    assert not (directory / "lock").exists()


def test_a_second_build_in_the_same_folder_waits_for_the_first(fake_load, tmp_path):
    import fcntl
    import threading

    directory = kernels.build_directory()
    directory.mkdir(parents=True)
    guard = open(directory / "kvserve_build.flock", "w")  # another process is building here
    fcntl.flock(guard, fcntl.LOCK_EX)
    done = threading.Event()
    threading.Thread(target=lambda: (kernels.cpu_kernels(), done.set()), daemon=True).start()
    assert not done.wait(0.5) and fake_load == []
    fcntl.flock(guard, fcntl.LOCK_UN)
    guard.close()
    assert done.wait(10) and len(fake_load) == 1
