"""Chained hashes of full KV blocks: the keys of the prefix cache.

Each full block's hash covers its own tokens AND, through the parent hash, every token before it,
so equal hashes mean equal whole prefixes::

    tokens:  | t0 .. t15 | t16 .. t31 | t32 .. t40 (partial: no hash yet)
    hashes:     h0          h1
    h0 = H(ROOT_HASH, (t0..t15),  extra_keys)
    h1 = H(h0,        (t16..t31), extra_keys)

``extra_keys`` separate caches that must not share K/V even for equal tokens: the request's
``cache_salt`` (tenant isolation) and, when adapters exist, the adapter id.

H is SHA-256 of a protocol-5 pickle of ``(parent, tokens, extra_keys)``, read as a 256-bit
integer. It is stable across processes and runs (unlike Python's salted ``hash`` of strings), so
two engine processes or a router can compute the same keys; collisions are negligible. Scheme after
vLLM v1's ``hash_block_tokens`` (sha256 variant).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence

from kvserve.request import Request

# Parent of the first block of every request: a fixed constant so hashes are reproducible.
ROOT_HASH = int.from_bytes(hashlib.sha256(b"kvserve-prefix-cache-root").digest(), "big")


def hash_block_tokens(parent_hash: int, token_ids: Sequence[int], extra_keys: tuple = ()) -> int:
    """Hash one full block.

    Args:
        parent_hash: hash of the previous block of the same request, or ``ROOT_HASH``.
        token_ids: the block's ``block_size`` token ids.
        extra_keys: hashable, picklable values that must also match (cache salt, adapter id).

    Returns:
        a 256-bit non-negative integer.
    """
    payload = pickle.dumps((parent_hash, tuple(token_ids), extra_keys), protocol=5)
    return int.from_bytes(hashlib.sha256(payload).digest(), "big")


def request_extra_keys(request: Request) -> tuple:
    """The extra hash keys of a request: its adapter (``LoRARequest.hash_key``) when it has one,
    then ``cache_salt`` when it has a salt; ``()`` for a base-model request without a salt (so
    such hashes are unchanged by LoRA support)."""
    keys: tuple = ()
    if request.lora_request is not None:
        keys += (request.lora_request.hash_key,)
    if request.cache_salt is not None:
        keys += (request.cache_salt,)
    return keys


def update_block_hashes(request: Request, block_size: int) -> list[int]:
    """Extend ``request.block_hashes`` to cover every full block of ``request.all_token_ids``.

    Hashes already present are kept (tokens never change once known, also across preemption), so
    the cost is one hash per newly full block.

    Returns:
        ``request.block_hashes`` (the same list), one hash per full block, in block order.
    """
    hashes = request.block_hashes
    num_full_blocks = request.num_tokens // block_size
    if len(hashes) >= num_full_blocks:
        return hashes
    extra_keys = request_extra_keys(request)
    parent = hashes[-1] if hashes else ROOT_HASH
    tokens = request.all_token_ids
    for index in range(len(hashes), num_full_blocks):
        start = index * block_size
        parent = hash_block_tokens(parent, tokens[start : start + block_size], extra_keys)
        hashes.append(parent)
    return hashes
