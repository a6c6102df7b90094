"""``--cpu-threads``: the CPUs a process may use (affinity, cgroup v1/v2 quota) and the flag's values."""

from __future__ import annotations

import argparse
import os

import pytest

from kvserve import cpu_threads
from kvserve.cpu_threads import cgroup_cpu_limit, cpu_threads_arg, resolve_cpu_threads


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota_of_this_process(tmp_path):
    root, me = tmp_path / "cgroup", tmp_path / "self_cgroup"
    write(me, "0::/kubepods/pod1/ctr\n")
    write(root / "kubepods/pod1/ctr/cpu.max", "150000 100000\n")
    write(root / "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(root, me) == 1.5
    write(root / "kubepods/pod1/ctr/cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(root, me) is None


def test_cgroup_v1_quota(tmp_path):
    root, me = tmp_path / "cgroup", tmp_path / "self_cgroup"
    write(me, "4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n")
    write(root / "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "200000\n")
    write(root / "cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(root, me) == 2.0
    write(root / "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n")
    assert cgroup_cpu_limit(root, me) is None


def test_auto_is_affinity_bounded_by_the_quota_rounded_up(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(cpu_threads, "cgroup_cpu_limit", lambda: 1.5)
    assert resolve_cpu_threads("auto") == 2
    monkeypatch.setattr(cpu_threads, "cgroup_cpu_limit", lambda: None)
    assert resolve_cpu_threads(None) == 4 and resolve_cpu_threads(3) == 3
    monkeypatch.setattr(cpu_threads, "cgroup_cpu_limit", lambda: 0.2)
    assert resolve_cpu_threads("auto") == 1


def test_flag_values():
    assert cpu_threads_arg("auto") == "auto" and cpu_threads_arg("3") == 3
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="'auto' or an integer >= 1"):
            cpu_threads_arg(bad)
    with pytest.raises(ValueError):
        resolve_cpu_threads(0)


def test_wait_policy_default_leaves_the_users_settings_alone():
    assert cpu_threads.process_environment({}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert cpu_threads.process_environment({"OMP_WAIT_POLICY": "ACTIVE"}) == {}
    assert cpu_threads.process_environment({"GOMP_SPINCOUNT": "10000"}) == {}


def test_applied_before_torch_loads():
    import subprocess
    import sys

    code = ("import os\nfrom kvserve.cpu_threads import apply_cpu_threads\nn = apply_cpu_threads(1)\n"
            "import torch\nprint(n, os.environ['OMP_WAIT_POLICY'], os.environ['OMP_NUM_THREADS'], torch.get_num_threads())")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "PASSIVE", "1", "1"]
