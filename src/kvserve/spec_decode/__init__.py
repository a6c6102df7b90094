"""Speculative decoding: proposers (n-gram lookup, a draft model), driven by the engine core, and
the adaptive switch; drafts are verified by ``kvserve.sample.rejection_sampler``. See
``docs/speculative_decoding.md``.

This package's ``__init__`` imports nothing, so the torch-free parts (``config``, ``stats``,
``policy``) can be used by the scheduler without importing torch.
"""
