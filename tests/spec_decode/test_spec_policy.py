"""The adaptive switch: no drafts while the batch is larger than ``disable_by_batch_size``; a
request whose drafts are rejected pauses (8 steps, doubling per relapse up to 256) and tries
again; outputs stay the plain engine's either way."""

from __future__ import annotations

from kvserve import SamplingParams
from kvserve.config import SpeculativeConfig
from kvserve.spec_decode.policy import FIRST_PAUSE, MAX_PAUSE, SpecDecodePolicy
from kvserve.testing.spec_decode import ForcedProposer, reference_drafts
from spec_helpers import NGRAM, copy_prompts, make_llm, results, spec_stats

PROMPTS = copy_prompts(4, seed=41)
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


def test_policy_pauses_double_and_reset():
    policy = SpecDecodePolicy(SpeculativeConfig("ngram", 4, min_acceptance_rate=0.25, disable_by_batch_size=2))
    assert policy.batch_allows(2) and not policy.batch_allows(3)
    policy.observe("r", 4, 0)
    assert policy.request_allows("r")  # 4 drafted tokens: not yet evidence
    policy.observe("r", 4, 0)  # 4 * 0.8 + 4 = 7.2
    policy.observe("r", 4, 0)  # 9.76 >= 8, nothing accepted: pause
    assert not policy.request_allows("r")
    for _ in range(FIRST_PAUSE):
        policy.batch_allows(1)
    assert policy.request_allows("r")
    for _ in range(3):
        policy.observe("r", 4, 0)
    assert not policy.request_allows("r")  # relapse: 16 steps now
    for _ in range(FIRST_PAUSE):
        policy.batch_allows(1)
    assert not policy.request_allows("r")
    for _ in range(FIRST_PAUSE):
        policy.batch_allows(1)
    assert policy.request_allows("r")
    for _ in range(3):
        policy.observe("r", 4, 4)  # accepted again: the next relapse pauses briefly
    assert policy._requests["r"].pause == FIRST_PAUSE and MAX_PAUSE == 256
    policy.forget("r")
    assert policy.request_allows("r")


def test_batch_switch_and_rejected_drafts_in_the_engine(tiny_llama):
    plain = results(make_llm(tiny_llama).generate(PROMPTS, GREEDY))
    mapping = {tuple(p): r[0][0] for p, r in zip(PROMPTS, plain)}
    big = make_llm(tiny_llama, speculative_config={**NGRAM, "disable_by_batch_size": 3})
    big.llm_engine.core.proposer = ForcedProposer(reference_drafts(mapping, 4, "all"))
    assert results(big.generate(PROMPTS, GREEDY)) == plain
    assert spec_stats(big).num_drafts == 0  # four running > 3: nobody proposed
    assert results(big.generate(PROMPTS[:3], GREEDY)) == plain[:3] and spec_stats(big).num_drafts > 0
    wrong = make_llm(tiny_llama, speculative_config={**NGRAM, "min_acceptance_rate": 0.5})
    wrong.llm_engine.core.proposer = ForcedProposer(reference_drafts(mapping, 4, "none"))
    assert results(wrong.generate(PROMPTS[:1], GREEDY)) == plain[:1]
    stats = spec_stats(wrong)
    # 40 tokens, one per step: 3 rejected drafts pause it for 8 steps, 3 more for 16: about 8 drafts
    assert stats.num_accepted_tokens == 0 and 4 <= stats.num_drafts <= 12
