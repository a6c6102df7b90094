import pytest

from kvserve.kv_cache.manager import KVCacheManager
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams


def make_request(request_id, token_ids, **kwargs):
    params = kwargs.pop("sampling_params", SamplingParams())
    return Request.of(request_id, list(token_ids), params, **kwargs)


def run_prefill(manager, request):
    """Admit a request as the scheduler does and mark its whole prompt computed."""
    blocks, num_cached = manager.get_computed_blocks(request)
    request.num_computed_tokens = 0
    new_blocks = manager.allocate_slots(request, request.num_tokens - num_cached, blocks, num_cached)
    assert new_blocks is not None
    request.num_computed_tokens = request.num_tokens
    manager.cache_blocks(request, request.num_computed_tokens)
    return blocks, num_cached, new_blocks


@pytest.mark.parametrize("prompt_len, expected_cached", [(40, 32), (32, 16), (33, 32), (16, 0), (5, 0)])
def test_repeated_prompt_hits_expected_blocks(prompt_len, expected_cached):
    manager = KVCacheManager(num_blocks=20, block_size=16)
    first = make_request("a", range(prompt_len))
    run_prefill(manager, first)
    first_ids = manager.get_block_ids("a")
    manager.free(first)
    manager.check_integrity()
    second = make_request("b", range(prompt_len))
    hit_blocks, num_cached, new_blocks = run_prefill(manager, second)
    assert num_cached == expected_cached
    num_hit = expected_cached // 16
    assert [b.block_id for b in hit_blocks] == first_ids[:num_hit]
    assert manager.get_block_ids("b")[:num_hit] == first_ids[:num_hit]
    assert len(new_blocks) == -(-prompt_len // 16) - num_hit
    assert manager.stats.queries == 2 * prompt_len and manager.stats.hits == expected_cached
    manager.check_integrity()


def test_shared_prefix_is_ref_counted_and_freed_tail_first():
    manager = KVCacheManager(num_blocks=10, block_size=4)
    a = make_request("a", range(10))
    run_prefill(manager, a)
    b = make_request("b", list(range(8)) + [99, 98, 97])
    _, num_cached, _ = run_prefill(manager, b)
    assert num_cached == 8
    shared = manager.req_to_blocks["a"][:2]
    assert [block.ref_cnt for block in shared] == [2, 2]
    assert manager.usage == pytest.approx(4 / 9)
    manager.check_integrity()
    manager.free(b)
    assert [block.ref_cnt for block in shared] == [1, 1]
    manager.free(a)
    a_ids = [1, 2, 3]
    b_tail = [4]
    free_order = [block.block_id for block in manager.block_pool.free_block_queue]
    # never-used blocks first, then b's tail, then a's blocks tail first
    assert free_order == [5, 6, 7, 8, 9] + b_tail + a_ids[::-1]
    manager.check_integrity()


def test_cache_salt_isolates():
    manager = KVCacheManager(num_blocks=10, block_size=4)
    run_prefill(manager, make_request("a", range(12), cache_salt="x"))
    assert manager.get_computed_blocks(make_request("b", range(12))).num_computed_tokens == 0
    assert manager.get_computed_blocks(make_request("c", range(12), cache_salt="y")).num_computed_tokens == 0
    assert manager.get_computed_blocks(make_request("d", range(12), cache_salt="x")).num_computed_tokens == 8
    manager.check_integrity()


def test_generated_tokens_are_cached_and_prompt_logprobs_skip_cache():
    manager = KVCacheManager(num_blocks=10, block_size=4)
    a = make_request("a", range(6))
    run_prefill(manager, a)
    for token in (50, 51, 52):  # decode: each sampled token is computed the next step
        a.append_output_token_ids([token])
        assert manager.allocate_slots(a, 1) is not None
        a.num_computed_tokens += 1
        manager.cache_blocks(a, a.num_computed_tokens)
    assert len(manager.block_pool.cached_block_hash_to_block) == 2
    b = make_request("b", [0, 1, 2, 3, 4, 5, 50, 51, 7])
    assert manager.get_computed_blocks(b).num_computed_tokens == 8
    logprob_request = make_request("c", b.prompt_token_ids, sampling_params=SamplingParams(prompt_logprobs=1))
    assert manager.get_computed_blocks(logprob_request).num_computed_tokens == 0
    manager.free(a)
    manager.check_integrity()


def test_allocate_failure_changes_nothing_and_counts_free_hits():
    manager = KVCacheManager(num_blocks=5, block_size=16)  # 4 usable
    a = make_request("a", range(40))
    run_prefill(manager, a)
    manager.free(a)
    b = make_request("b", list(range(40)) + list(range(100, 125)))  # 65 tokens -> 5 blocks
    blocks, num_cached = manager.get_computed_blocks(b)
    assert num_cached == 32
    assert manager.allocate_slots(b, 33, blocks, num_cached) is None
    assert manager.num_free_blocks == 4 and "b" not in manager.req_to_blocks
    assert manager.stats.queries == 40  # only admissions count
    manager.check_integrity()
    c = make_request("c", list(range(40)) + list(range(100, 124)))  # 64 tokens -> 4 blocks
    blocks, num_cached = manager.get_computed_blocks(c)
    assert len(manager.allocate_slots(c, 32, blocks, num_cached)) == 2
    assert manager.num_free_blocks == 0 and manager.usage == 1.0
    manager.check_integrity()


def test_caching_off_and_reset_prefix_cache():
    manager = KVCacheManager(num_blocks=10, block_size=4, enable_caching=False)
    run_prefill(manager, make_request("a", range(12)))
    assert manager.get_computed_blocks(make_request("b", range(12))).num_computed_tokens == 0
    assert manager.stats.queries == 0
    manager.check_integrity()
    cached = KVCacheManager(num_blocks=10, block_size=4)
    run_prefill(cached, make_request("a", range(12)))
    assert cached.reset_prefix_cache() == 3
    assert cached.get_computed_blocks(make_request("b", range(12))).num_computed_tokens == 0
    cached.check_integrity()


def test_integrity_check_catches_corruption():
    manager = KVCacheManager(num_blocks=6, block_size=4)
    a = make_request("a", range(8))
    run_prefill(manager, a)
    manager.req_to_blocks["a"][0].ref_cnt += 1
    with pytest.raises(AssertionError, match="has ref_cnt 2 but 1 requests hold it"):
        manager.check_integrity()
    manager.req_to_blocks["a"][0].ref_cnt -= 1
    block = manager.req_to_blocks["a"][1]
    manager.block_pool.cached_block_hash_to_block.pop(block.block_hash)
    with pytest.raises(AssertionError, match="carry a hash but the map has"):
        manager.check_integrity()
