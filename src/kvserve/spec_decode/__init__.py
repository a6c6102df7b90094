"""Speculative decoding: proposers (n-gram lookup, a draft model), draft verification and the
adaptive switch. See ``docs/speculative_decoding.md``.

This package's ``__init__`` imports nothing, so the torch-free parts (``config``, ``stats``,
``policy``) can be used by the scheduler without importing torch.
"""
