"""``kvserve.pooling.pooler.Pooler`` on hand-made hidden states, against numpy in float64: each
request pooled from its own rows (CLS, MEAN, LAST), Matryoshka cut before the L2 norm, and the
same bits whatever the other requests of the step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvserve.pooling.config import PoolerConfig
from kvserve.pooling.params import PoolingParams
from kvserve.pooling.pooler import Pooler

SPANS = [(0, 3), (3, 4), (4, 9)]


def _pooler(kind: str) -> Pooler:
    return Pooler(PoolerConfig(task="embed", pooling_type=kind, use_activation=True, hidden_size=6))


def _expected(rows: np.ndarray, kind: str, dims: int | None, normalize: bool) -> np.ndarray:
    pooled = {"CLS": rows[0], "LAST": rows[-1], "MEAN": rows.mean(axis=0)}[kind]
    pooled = pooled[:dims] if dims else pooled
    return pooled / max(np.linalg.norm(pooled), 1e-12) if normalize else pooled


@pytest.mark.parametrize("kind", ["CLS", "MEAN", "LAST"])
@pytest.mark.parametrize("dims, normalize", [(None, True), (None, False), (4, True)])
def test_each_request_pools_its_own_rows(kind, dims, normalize):
    hidden = torch.randn(9, 6, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    params = [PoolingParams(task="embed", use_activation=normalize, dimensions=dims)] * len(SPANS)
    vectors = _pooler(kind)(hidden, SPANS, params)
    rows = hidden.double().numpy()
    for vector, (start, end) in zip(vectors, SPANS, strict=True):
        assert vector.dtype == torch.float32 and vector.device.type == "cpu"
        np.testing.assert_allclose(vector.numpy(), _expected(rows[start:end], kind, dims, normalize), rtol=1e-6,
                                   atol=1e-7)


def test_a_request_gets_the_same_bits_wherever_it_sits():
    generator = torch.Generator().manual_seed(1)
    mine = torch.randn(37, 512, generator=generator)
    others = torch.randn(50, 512, generator=generator)
    pooler = _pooler("MEAN")
    params = PoolingParams(task="embed", use_activation=True)
    alone = pooler(mine, [(0, 37)], [params])[0]
    batched = pooler(torch.cat([others[:13], mine, others[13:]]), [(0, 13), (13, 50), (50, 87)], [params] * 3)[1]
    assert torch.equal(alone, batched)


def test_only_completed_pooling_requests_pool_and_a_chunked_one_is_refused():
    from types import SimpleNamespace

    embed_params = PoolingParams(task="embed", use_activation=True)
    specs = [SimpleNamespace(request_id="gen", pooling_params=None),
             SimpleNamespace(request_id="a", pooling_params=embed_params),
             SimpleNamespace(request_id="later", pooling_params=embed_params)]
    ids, spans, params = Pooler.requests_to_pool(specs, np.array([True, True, False]), np.zeros(3, dtype=np.int64),
                                                 np.array([0, 1, 4, 9]))
    assert (ids, spans, params) == (["a"], [(1, 4)], [embed_params])
    with pytest.raises(ValueError, match="pooling requests run whole"):
        Pooler.requests_to_pool(specs, np.array([False, True, False]), np.array([0, 3, 0]), np.array([0, 1, 4, 9]))
