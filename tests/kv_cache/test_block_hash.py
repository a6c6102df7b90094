import hashlib
import pickle

from kvserve.kv_cache.block_hash import ROOT_HASH, hash_block_tokens, update_block_hashes
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams


def reference_hash(parent, tokens, extra):
    digest = hashlib.sha256(pickle.dumps((parent, tuple(tokens), extra), protocol=5)).digest()
    return int.from_bytes(digest, "big")


def test_chain_matches_independent_computation():
    tokens = list(range(10))
    request = Request.of("r", tokens, SamplingParams())
    hashes = update_block_hashes(request, 4)
    h0 = reference_hash(ROOT_HASH, [0, 1, 2, 3], ())
    h1 = reference_hash(h0, [4, 5, 6, 7], ())
    assert hashes == [h0, h1]
    assert hash_block_tokens(ROOT_HASH, [0, 1, 2, 3]) == h0


def test_incremental_update_and_salt():
    request = Request.of("r", list(range(7)), SamplingParams())
    assert len(update_block_hashes(request, 4)) == 1
    request.append_output_token_ids([7])
    full = Request.of("f", list(range(8)), SamplingParams())
    assert update_block_hashes(request, 4) == update_block_hashes(full, 4)
    salted = Request.of("s", list(range(8)), SamplingParams(), cache_salt="tenant-a")
    salted_hashes = update_block_hashes(salted, 4)
    assert salted_hashes[0] == reference_hash(ROOT_HASH, [0, 1, 2, 3], ("tenant-a",))
    assert salted_hashes[0] != full.block_hashes[0]
