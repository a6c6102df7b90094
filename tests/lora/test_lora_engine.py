"""LoRA through the offline ``LLM`` (vLLM's API): greedy tokens against ``peft``, mixed batches,
the prefix cache per adapter, LRU eviction and reload, and refused adapters."""

from __future__ import annotations

import shutil

import pytest
from lora_fixtures import AdapterSpec, edit_adapter_config, make_adapter, peft_logits

from kvserve import LLM, LoRARequest, SamplingParams
from kvserve.errors import InvalidRequestError
from kvserve.lora.peft_adapter import LoRAAdapterError

PROMPTS = [[(7 * i + 3) % 200 + 5 for i in range(21)], [(11 * i + 5) % 200 + 5 for i in range(9)],
           [(13 * i + 1) % 200 + 5 for i in range(40)], [17, 23, 99], [(5 * i + 2) % 200 + 5 for i in range(14)]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)


def _llm(base, **kwargs) -> LLM:
    options = dict(dtype="float32", enable_lora=True, max_loras=4, max_lora_rank=64, max_model_len=256,
                   block_size=16, num_gpu_blocks_override=128)
    return LLM(str(base), **{**options, **kwargs})


def _loras(adapters) -> list[LoRARequest]:
    return [LoRARequest(f"adapter-{i}", i + 1, str(folder)) for i, (folder, _) in enumerate(adapters)]


def _tokens_and_logprobs(output):
    choice = output.outputs[0]
    return choice.token_ids, [lp.logprob for lp in choice.logprobs]


@pytest.fixture(scope="module")
def llm(qwen2_with_adapters):
    return _llm(qwen2_with_adapters[0])


def test_greedy_tokens_match_peft_alone_and_in_a_mixed_batch(llm, qwen2_with_adapters):
    _, adapters = qwen2_with_adapters
    loras = _loras(adapters) + [None]
    mixed = llm.generate(PROMPTS, GREEDY, lora_request=loras)
    for prompt, lora, output, (_, ref) in zip(PROMPTS, loras, mixed, adapters + [(None, None)]):
        tokens, logprobs = _tokens_and_logprobs(output)
        alone = llm.generate([prompt], GREEDY, lora_request=lora)[0]
        assert _tokens_and_logprobs(alone) == (tokens, logprobs)  # same bits alone and mixed
        if ref is not None:  # teacher-forced: peft's argmax at every generated position
            logits = peft_logits(ref, prompt + tokens[:-1])[len(prompt) - 1:]
            assert logits.argmax(-1).tolist() == tokens
    base_tokens = [_tokens_and_logprobs(o)[0] for o in llm.generate(PROMPTS[:4], GREEDY)]
    assert base_tokens != [_tokens_and_logprobs(o)[0] for o in mixed[:4]]


def test_prefix_cache_is_not_shared_across_adapters(llm, qwen2_with_adapters):
    loras = _loras(qwen2_with_adapters[1])
    prompt = [(3 * i + 11) % 200 + 5 for i in range(40)]  # two full 16-token blocks
    first = llm.generate([prompt], GREEDY, lora_request=loras[0])[0]
    other = llm.generate([prompt], GREEDY, lora_request=loras[1])[0]
    base = llm.generate([prompt], GREEDY)[0]
    again = llm.generate([prompt], GREEDY, lora_request=loras[0])[0]
    assert (first.num_cached_tokens, other.num_cached_tokens, base.num_cached_tokens) == (0, 0, 0)
    assert again.num_cached_tokens == 32
    assert _tokens_and_logprobs(again) == _tokens_and_logprobs(first)


def test_lru_eviction_and_reload_give_identical_outputs(qwen2_with_adapters):
    """One slot, one adapter in CPU memory: every switch evicts and reads the folder again; four
    adapters in one call run one at a time (the scheduler keeps --max-loras)."""
    base, adapters = qwen2_with_adapters
    loras = _loras(adapters)
    reference = _llm(base)
    expected = [_tokens_and_logprobs(o) for o in reference.generate(PROMPTS[:4], GREEDY, lora_request=loras)]
    small = _llm(base, max_loras=1, max_cpu_loras=1)
    for _ in range(2):
        for prompt, lora, want in zip(PROMPTS, loras, expected):
            assert _tokens_and_logprobs(small.generate([prompt], GREEDY, lora_request=lora)[0]) == want
    together = small.generate(PROMPTS[:4], GREEDY, lora_request=loras)
    assert [_tokens_and_logprobs(o) for o in together] == expected
    manager = small.llm_engine.core.runner.lora
    assert manager.num_disk_loads >= 8 and len(manager.cache) == 1


@pytest.mark.parametrize("change, field", [
    ({"use_dora": True}, "use_dora"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"bias": "all"}, "bias"),
    ({"target_modules": ["q_proj", "embed_tokens"]}, "target_modules"),
    ({"peft_type": "IA3"}, "peft_type"),
    ({"r": 128}, "r=128 exceeds --max-lora-rank 64"),
])
def test_unsupported_adapters_are_refused_naming_the_field(llm, qwen2_with_adapters, tmp_path, change, field):
    folder = tmp_path / "bad"
    shutil.copytree(qwen2_with_adapters[1][0][0], folder)
    edit_adapter_config(folder, **change)
    with pytest.raises(LoRAAdapterError) as info:
        llm.generate([PROMPTS[0]], GREEDY, lora_request=LoRARequest("bad", 99, str(folder)))
    assert field in str(info.value) and "\n" not in str(info.value)


def test_adapter_of_another_base_model_is_refused_with_the_shapes(llm, tiny_checkpoint, tmp_path):
    other_base, _ = tiny_checkpoint("qwen3")  # head_dim 32: q_proj has 128 outputs, not 64
    make_adapter(other_base, tmp_path, AdapterSpec(4, ("q_proj",)))
    with pytest.raises(LoRAAdapterError, match=r"has shape \[128, 4\], the base model needs \[64, 4\]"):
        llm.generate([PROMPTS[0]], GREEDY, lora_request=LoRARequest("other", 98, str(tmp_path)))


def test_missing_folder_and_lora_off_are_refused(llm, qwen2_with_adapters, tmp_path):
    with pytest.raises(LoRAAdapterError, match="does not exist"):
        llm.generate([PROMPTS[0]], GREEDY, lora_request=LoRARequest("gone", 97, str(tmp_path / "nowhere")))
    plain = LLM(str(qwen2_with_adapters[0]), dtype="float32", max_model_len=128, num_gpu_blocks_override=32)
    with pytest.raises(InvalidRequestError, match="--enable-lora"):
        plain.generate([PROMPTS[0]], GREEDY, lora_request=_loras(qwen2_with_adapters[1])[0])
