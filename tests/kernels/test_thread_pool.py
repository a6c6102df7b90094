"""The kernels' worker pool (``csrc/thread_pool.h``): which thread runs which items never changes
a result. Real kernels (the bfloat16 linear on AMX tiles where the CPU has them, the float32 one)
give the bits of a one-thread run with any thread count, on the pool (its workers sleeping at
once or spinning) and on OpenMP's threads, and when two Python threads call kernels in turn (the
kernels keep the GIL, so their calls never overlap; callers at once, one running inline while the
other holds the pool, are in test_thread_pool_stress.py). The pool is used where OpenMP's threads
sleep at once (``kvserve.cpu_threads.openmp_threads_sleep``)."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from kvserve.cpu_threads import openmp_threads_sleep
from kvserve.kernels import cpu_kernels, cpu_kernels_available
from kvserve.model.invariant_linear import InvariantLinear

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")


def _layers() -> list[InvariantLinear]:
    """A bfloat16 layer (AMX tiles where the CPU has them) and a float32 one, Qwen2.5-0.5B's
    gate/up width: enough work items for every thread count below."""
    torch.manual_seed(0)
    layers = []
    for dtype in (torch.bfloat16, torch.float32):
        linear = nn.Linear(896, 1216, bias=True)
        with torch.no_grad():
            linear.weight.normal_()
            linear.bias.normal_()
        layers.append(InvariantLinear(linear.to(dtype), cpu_kernels()))
    return layers


def _inputs(dtype: torch.dtype) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(rows, 896, generator=generator).to(dtype) for rows in (1, 7, 64)]


def _run_all(layers: list[InvariantLinear]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [layer(x) for layer in layers for x in _inputs(layer.weight_dtype)]


@pytest.fixture(scope="module")
def layers():
    return _layers()


@pytest.fixture(scope="module")
def reference(layers):
    """Every output computed on one thread (the pool is not used: the region runs inline)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run_all(layers)
    finally:
        torch.set_num_threads(threads)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def _assert_same_bits(outputs: list[torch.Tensor], reference: list[torch.Tensor]) -> None:
    assert len(outputs) == len(reference)
    for out, ref in zip(outputs, reference):
        assert out.dtype == ref.dtype and torch.equal(_bits(out), _bits(ref))


@pytest.fixture
def pool():
    """The kernels with the pool on; its settings restored afterwards."""
    kernels = cpu_kernels()
    enabled, spin_us = kernels.pool_enabled(), kernels.pool_spin_us()
    kernels.set_pool_enabled(True)
    yield kernels
    kernels.set_pool_enabled(enabled)
    kernels.set_pool_spin_us(spin_us)


def test_the_pool_is_used_where_openmp_threads_sleep():
    assert openmp_threads_sleep({"OMP_WAIT_POLICY": "passive"}) and openmp_threads_sleep({"GOMP_SPINCOUNT": "0"})
    assert not openmp_threads_sleep({}) and not openmp_threads_sleep({"OMP_WAIT_POLICY": "ACTIVE"})
    assert not openmp_threads_sleep({"GOMP_SPINCOUNT": "10000"})
    assert cpu_kernels().pool_enabled() == openmp_threads_sleep()


@pytest.mark.parametrize("threads", [2, 3, 5])
@pytest.mark.parametrize(("enabled", "spin_us"), [(True, 0), (True, 200), (False, 200)])
def test_any_thread_count_and_wait_gives_the_one_thread_bits(layers, reference, threads, enabled, spin_us, pool):
    pool.set_pool_enabled(enabled)
    pool.set_pool_spin_us(spin_us)
    assert pool.pool_enabled() == enabled and pool.pool_spin_us() == spin_us
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for _ in range(3):  # workers asleep (first round, spin 0) and awake
            _assert_same_bits(_run_all(layers), reference)
    finally:
        torch.set_num_threads(before)


def test_two_python_threads_at_once(layers, reference, pool):
    """Two Python threads calling kernels (in turn: the kernels keep the GIL) get the same bits."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    results: dict[int, list[list[torch.Tensor]]] = {0: [], 1: []}
    errors: list[BaseException] = []

    def work(slot: int) -> None:
        try:
            for _ in range(10):
                results[slot].append(_run_all(layers))
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            errors.append(error)

    try:
        workers = [threading.Thread(target=work, args=(slot,)) for slot in (0, 1)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=120)
    finally:
        torch.set_num_threads(before)
    assert not errors and all(len(r) == 10 for r in results.values())
    for rounds in results.values():
        for outputs in rounds:
            _assert_same_bits(outputs, reference)
