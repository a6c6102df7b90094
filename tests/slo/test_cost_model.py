"""The step-cost model recovers the coefficients of steps that follow it exactly, never goes below
zero, says when it is ready, and inverts itself for the TPOT prefill cap."""

from __future__ import annotations

import numpy as np
import pytest

from kvserve.slo.cost_model import DEFAULT_MARGIN, MARGIN_BOUNDS, StepCostModel, StepWork

TRUE = np.array([0.012, 0.0006, 0.0002, 0.35])


def seconds(work: StepWork, coefficients=TRUE) -> float:
    return float(np.dot(coefficients, work.features()))


def works(count: int, seed: int = 3) -> list[StepWork]:
    rng = np.random.default_rng(seed)
    result = []
    for i in range(count):
        prefill = int(rng.integers(0, 600)) if i % 2 else 0
        rows = int(rng.integers(1, 64))
        result.append(StepWork(prefill, rows, float(rng.integers(0, 200_000))))
    return result


def test_the_fit_recovers_exact_coefficients_and_becomes_ready():
    model = StepCostModel(window=256, refit_every=8, min_observations=8)
    steps = works(40)
    for work in steps[:15]:
        model.observe(work, seconds(work))
    assert not model.ready  # fewer than 8 steps of each kind
    for work in steps[15:]:
        model.observe(work, seconds(work))
    assert model.ready and model.observations == 40
    np.testing.assert_allclose(model.coefficients, TRUE, rtol=1e-9)
    probe = StepWork(333, 17, 12_345.0)
    assert model.predict(probe) == pytest.approx(seconds(probe), rel=1e-9)
    assert model.describe()["coefficients"]["prefill_token"] == pytest.approx(0.0006, rel=1e-9)


def test_a_negative_coefficient_is_dropped_and_the_rest_refitted():
    model = StepCostModel(window=256, refit_every=1, min_observations=1)
    truth = np.array([0.02, 0.0005, 0.0, 0.0])  # decode rows and attention cost nothing here
    rng = np.random.default_rng(5)
    for work in works(64):
        model.observe(work, seconds(work, truth) + float(rng.normal(0, 1e-4)))  # noise could push one below 0
    assert (model.coefficients >= 0).all()
    assert model.coefficients[0] == pytest.approx(0.02, abs=2e-4) and model.coefficients[1] == pytest.approx(0.0005, rel=0.02)


def test_the_window_forgets_old_steps():
    model = StepCostModel(window=32, refit_every=4, min_observations=1)
    for work in works(32, seed=1):
        model.observe(work, seconds(work))
    doubled = 2 * TRUE
    for work in works(32, seed=2):
        model.observe(work, seconds(work, doubled))
    np.testing.assert_allclose(model.coefficients, doubled, rtol=1e-9)


def test_prefill_tokens_within_is_the_largest_chunk_that_fits():
    model = StepCostModel()
    model.coefficients = TRUE.copy()
    for limit, rows, pairs, context in [(0.05, 4, 900.0, 0), (0.1, 30, 50_000.0, 2_000), (0.03, 1, 10.0, 500)]:
        x = model.prefill_tokens_within(limit, rows, pairs, context)
        fits = lambda n: model.predict(StepWork(n, rows, pairs + n * (context + n / 2))) <= limit  # noqa: E731
        assert fits(x) and not fits(x + 1)
    assert model.prefill_tokens_within(0.001, 4, 0.0) == 0  # the decodes alone take longer


def test_the_margin_is_the_inverse_of_the_90th_percentile_of_actual_over_predicted():
    model = StepCostModel(refit_every=1 << 20, min_observations=8)  # no refit: each step meets one fit
    model.coefficients = TRUE.copy()
    assert model.margin == DEFAULT_MARGIN  # nothing compared yet
    ratios = [1.0 + 0.5 * (i % 11) / 10 for i in range(110)]  # 1.0, 1.05, ..., 1.5, eleven times
    for work, ratio in zip(works(110), ratios):
        model.observe(work, ratio * seconds(work))
    model.fit()
    assert model.margin == pytest.approx(1 / np.quantile(ratios, 0.9), rel=1e-9)  # 1 / 1.45
    assert model.describe()["margin"] == model.margin


@pytest.mark.parametrize("ratio,expected", [(1.0, MARGIN_BOUNDS[1]), (4.0, MARGIN_BOUNDS[0])])
def test_the_margin_stays_within_its_bounds(ratio, expected):
    model = StepCostModel(refit_every=1 << 20, min_observations=8)
    model.coefficients = TRUE.copy()
    for work in works(16):
        model.observe(work, ratio * seconds(work))
    model.fit()
    assert model.margin == expected
