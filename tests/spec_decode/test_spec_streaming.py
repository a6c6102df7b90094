"""Speculative decoding through the server: a stream carries several tokens per delta when drafts
are accepted, and its text, tokens and logprobs are the plain engine's; a stop string completed
inside accepted drafts ends the stream there; ``/metrics`` exports vLLM's ``spec_decode_*``
counters equal to the engine's own counts."""

from __future__ import annotations

import httpx
import pytest

from kvserve import SamplingParams
from kvserve.bench.spec_metrics import parse_counters
from kvserve.testing.live_server import start_live_server
from kvserve.testing.spec_decode import ForcedProposer, reference_drafts
from spec_helpers import NGRAM, copy_prompts, make_llm, results

PROMPTS = copy_prompts(3, seed=31)
MAX_TOKENS = 20


@pytest.fixture(scope="module")
def plain(tiny_llama):
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=1)
    return results(make_llm(tiny_llama).generate(PROMPTS, params))


@pytest.fixture(scope="module")
def server(tiny_llama, plain):
    srv = start_live_server(str(tiny_llama), max_model_len=256, block_size=16, num_gpu_blocks_override=128,
                            dtype="float32", seed=0, speculative_config=NGRAM)
    mapping = {tuple(p): r[0][0] for p, r in zip(PROMPTS, plain)}
    srv.core.proposer = ForcedProposer(reference_drafts(mapping, 4, "prefix", seed=2))
    yield srv
    srv.stop()


def stream(srv, prompt: list[int], **extra) -> list:
    client = srv.make_client()
    chunks = client.completions.create(model=srv.model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                       stream=True, logprobs=1, extra_body={"ignore_eos": True, **extra})
    return [c.choices[0] for c in chunks if c.choices]


def test_a_stream_carries_several_tokens_per_delta_and_the_plain_output(server, plain):
    widths = []
    for prompt, ref in zip(PROMPTS, plain):
        token_ids, logprobs, _, text = ref[0]
        choices = stream(server, prompt)
        assert "".join(c.text for c in choices) == text
        tokens = [t for c in choices if c.logprobs for t in c.logprobs.token_logprobs]
        assert tokens == [lp[1] for lp in logprobs]  # the logprob of each token, bit for bit
        widths += [len(c.logprobs.token_logprobs) for c in choices if c.logprobs]
        assert choices[-1].finish_reason == "length"
    assert max(widths) > 1 and sum(widths) == MAX_TOKENS * len(PROMPTS)


def test_a_stop_string_inside_accepted_drafts_ends_the_stream_there(server, tiny_llama, plain):
    llm = make_llm(tiny_llama)
    for prompt, ref in zip(PROMPTS, plain):
        text = ref[0][3]
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        want = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True,
                                                     stop=[stop]))[0].outputs[0]
        choices = stream(server, prompt, stop=[stop])
        assert "".join(c.text for c in choices) == want.text and choices[-1].finish_reason == "stop"


def test_metrics_export_the_engine_counts(server):
    stream(server, PROMPTS[0])
    counts = server.core.scheduler.make_stats().spec_decoding
    exported = parse_counters(httpx.get(server.base_url + "/metrics", timeout=10).text)
    assert exported.num_drafts == counts.num_drafts > 0
    assert exported.num_draft_tokens == counts.num_draft_tokens and exported.num_accepted_tokens == counts.num_accepted_tokens
    assert (exported.num_accepted_tokens_per_pos == counts.num_accepted_tokens_per_pos
            and len(exported.num_accepted_tokens_per_pos) == 4)
    assert 0 < counts.num_accepted_tokens < counts.num_draft_tokens
