"""The K/V a prompt leaves do not depend on how it was split (issue 26, class 4): a cold full prefill, a
prefix-cache hit (its remainder down to one token), chunked prefill at any chunk size, with the fused
decode step and the few-row kernels on (bf16 on the CPU, as the defaults run). Checked bit for bit on the
K/V of every prompt position, then token for token (and logprob for logprob) on the greedy answer."""
from __future__ import annotations

import random

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.models.layers.attention import PrefillSeq, _chunk_attention

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=2)
PROMPT_LENGTHS = (20, 33, 37, 49, 150)  # 33: one token left after a 32-token cache hit
CHUNKS = (512, 100, 23, 16, 7)


def make(folder, chunk: int) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(folder), dtype="bfloat16", num_threads=1, num_kv_blocks=96,
                                  block_size=16, max_num_batched_tokens=chunk))


def prompt_kv_and_answer(eng: LLMEngine, ids: list[int]):
    """Run `ids` greedily; (K/V of its prompt positions in every layer, token ids, logprobs)."""
    rid = eng.add_request(ids, GREEDY)
    kv = None
    outs = []
    while eng.has_unfinished():
        for out in eng.step():
            outs.append(out)
        req = eng._requests.get(rid)
        if kv is None and req is not None and req.num_computed_tokens >= len(ids):
            table, bs = eng.block_manager.block_table(rid), eng.block_manager.block_size
            slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(len(ids))])
            kv = [torch.cat([k.index_select(1, slots), v.index_select(1, slots)]) for k, v in eng.runner.kv_caches]
    tokens = [t for o in outs for t in o.token_ids]
    logprobs = [lp for o in outs for lp in (o.logprobs or ())]
    return kv, tokens, logprobs


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(7)
    shared = [rng.randrange(3, 380) for _ in range(32)]
    return {n: shared[:min(n, 32)] + [rng.randrange(3, 380) for _ in range(max(0, n - 32))] for n in PROMPT_LENGTHS}


@pytest.fixture(scope="module")
def reference(tiny_llama_hd64, prompts):
    """Each prompt cold, in one chunk, on a fresh engine."""
    return {n: prompt_kv_and_answer(make(tiny_llama_hd64, 512), ids) for n, ids in prompts.items()}


def _same(got, want, what: str) -> None:
    kv, tokens, logprobs = got
    want_kv, want_tokens, want_logprobs = want
    for layer, (a, b) in enumerate(zip(kv, want_kv)):
        assert torch.equal(a, b), f"{what}: layer {layer} K/V differ by {(a.float() - b.float()).abs().max():.3g}"
    assert tokens == want_tokens, what
    assert logprobs == want_logprobs, what


@pytest.mark.parametrize("chunk", CHUNKS)
def test_a_prompt_leaves_the_same_kv_whatever_the_split(tiny_llama_hd64, prompts, reference, chunk):
    eng = make(tiny_llama_hd64, chunk)
    for n, ids in prompts.items():  # cold (the first shares nothing cached); then hits on the shared 32
        _same(prompt_kv_and_answer(eng, ids), reference[n], f"{n} tokens, chunk {chunk}, first run")
    assert eng.stats().num_prefix_cache_hit_tokens > 0
    for n, ids in prompts.items():  # the same prompts again: their own blocks are cached now
        _same(prompt_kv_and_answer(eng, ids), reference[n], f"{n} tokens, chunk {chunk}, cached")


def test_a_prompt_remainder_of_one_token_is_a_prefill_not_a_decode(tiny_llama_hd64, prompts):
    eng = make(tiny_llama_hd64, 512)
    eng.generate([prompts[33]], GREEDY)
    rid = eng.add_request(prompts[33], GREEDY)
    steps = []
    eng.add_listener(lambda ev: steps.append((ev.stats.num_prefill_tokens, ev.stats.num_decode_tokens)))
    eng.step()
    req = eng.scheduler.running[0]
    assert req.request_id == rid and req.num_cached_tokens == 32
    # scheduled as a prompt token, never as a decode (under batch invariance the fused step runs prompt rows
    # too, as prompt rows; the K/V it leaves are held to the unsplit prompt's by the test above)
    assert steps == [(1, 0)]


def test_chunk_attention_gives_each_query_the_same_row_whatever_the_cut():
    """The kernels sum over the keys in blocks with a tail of their own: unpadded, 100 keys and 300 round
    differently (KEY_ALIGN pads every chunk's keys to a multiple of 64)."""
    torch.manual_seed(0)
    kv_heads, group, head_dim, n = 3, 3, 64, 300
    q = torch.randn(n, kv_heads * group, head_dim).bfloat16()
    k, v = torch.randn(kv_heads, n, head_dim).bfloat16(), torch.randn(kv_heads, n, head_dim).bfloat16()

    def rows(start: int, end: int) -> torch.Tensor:  # queries start..end of a chunk ending at `end`
        return _chunk_attention(q[start:end], k[:, :end], v[:, :end], PrefillSeq(0, end - start, end, None),
                                group, head_dim ** -0.5)

    whole = rows(0, n)
    for chunk in (1, 7, 37, 100, 129, 256):
        cut = torch.cat([rows(s, min(s + chunk, n)) for s in range(0, n, chunk)])
        assert torch.equal(cut, whole), f"chunks of {chunk}"


class CountingStream:
    """The native weight-streaming module, counting the rows of every call."""

    def __init__(self, inner) -> None:
        self.inner, self.rows = inner, []

    def stream_linear_bf16(self, x, weight, bias):
        self.rows.append(x.shape[0])
        return self.inner.stream_linear_bf16(x, weight, bias)


def test_prompt_rows_never_take_the_few_row_kernel(tiny_llama_hd64, prompts):
    """A 5-token remainder after a cache hit runs on the library GEMM, as the whole prompt did (the
    few-row kernel rounds differently: on SmolLM2 that flipped a greedy answer); decodes still stream."""
    eng = LLMEngine(EngineConfig(model=str(tiny_llama_hd64), dtype="bfloat16", num_threads=1, num_kv_blocks=96,
                                 block_size=16, fused_decode=False))
    # the layers that make K/V and hidden states (the lm_head reads the one producing row: 1 row either way)
    layers = [m for m in eng.model.layers.modules() if getattr(m, "stream", None) is not None]
    if not layers:
        pytest.skip("no native weight-streaming kernel here (no C++ toolchain)")
    counter = CountingStream(layers[0].stream)
    for m in layers:
        m.stream = counter
    eng.generate([prompts[33]], GREEDY)  # caches the shared 32 tokens
    counter.rows.clear()
    eng.add_request(prompts[37], GREEDY)
    eng.step()  # the 5-token remainder
    assert eng.scheduler.running[0].num_cached_tokens == 32
    assert counter.rows == []
    eng.step()  # a decode
    assert counter.rows and max(counter.rows) == 1
