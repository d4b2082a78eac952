"""FlexAttention with a paged block mask (engine/models/layers/flex_paged.py), CUDA's decode and
cached-context prefill path, run eagerly on the CPU against the reference attention."""
from __future__ import annotations

import math

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.models.layers import flex_paged
from engine.models.layers.attention import AttentionMetadata, DecodeGroup, PrefillSeq, paged_attention_reference

pytestmark = [pytest.mark.skipif(not flex_paged.available(), reason="this torch has no FlexAttention"),
              pytest.mark.filterwarnings("ignore::UserWarning")]  # "flex_attention called without compile"
BS, PAGES, KV_HEADS, HEADS, HEAD_DIM = 16, 12, 2, 6, 32
TABLES = [[3, 7, 1], [5, 0], [2, 9, 4, 11], [5, 8]]  # pages out of order; page 5 shared (a cached prefix)
LENS = [40, 17, 64, 21]


def _caches():
    torch.manual_seed(0)
    return torch.randn(KV_HEADS, PAGES * BS, HEAD_DIM), torch.randn(KV_HEADS, PAGES * BS, HEAD_DIM)


def _reference(q, k_cache, v_cache, seqs):
    md = AttentionMetadata(slot_mapping=torch.zeros(q.shape[0], dtype=torch.long), num_decode_tokens=0, seqs=seqs,
                           block_size=BS)
    return paged_attention_reference(q, k_cache, v_cache, md, 1 / math.sqrt(HEAD_DIM))


def test_decode_rows_read_their_own_pages_in_place():
    k_cache, v_cache = _caches()
    q = torch.randn(len(TABLES), HEADS, HEAD_DIM)
    width = max(map(len, TABLES))
    blocks = torch.tensor([t + [0] * (width - len(t)) for t in TABLES]).reshape(-1)  # padded with page 0
    group = DecodeGroup(0, len(TABLES), width * BS, blocks, None, torch.tensor(LENS))
    flex = flex_paged.FlexPaged(compiled=False)
    got = flex.decode(q, k_cache, v_cache, group, BS, 1 / math.sqrt(HEAD_DIM))
    want = _reference(q, k_cache, v_cache, [(i, 1, n, t) for i, (n, t) in enumerate(zip(LENS, TABLES))])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert group.flex_mask is not None  # built once, kept for the step's other layers


@pytest.mark.parametrize("q_len", [1, 5, 20, 130])  # 130: more than one query block of the mask
def test_a_prefill_chunk_over_a_cached_context_is_causal(q_len):
    k_cache, v_cache = _caches()
    table = [2, 9, 4, 11, 6, 10, 1, 3, 0, 5, 7, 8]
    ctx = 150 if q_len == 130 else 64
    q = torch.randn(q_len, HEADS, HEAD_DIM)
    seq = PrefillSeq(0, q_len, ctx, torch.tensor(table[: -(-ctx // BS)]))
    got = flex_paged.FlexPaged(compiled=False).prefill(q, k_cache, v_cache, seq, BS, 1 / math.sqrt(HEAD_DIM))
    want = _reference(q, k_cache, v_cache, [(0, q_len, ctx, table)])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_engine_on_flex_gives_the_reference_tokens(tiny_llama):
    """Decodes and chunked prefill (a budget of 24 tokens: every later chunk of a long prompt is a prefill
    over a cached context), with and without the graphs' static buffers (uncaptured on the CPU), all
    through FlexAttention."""
    prompts = ["The quick brown fox jumps over the lazy dog. " * 3 + "Hello", "a",
               "The quick brown fox jumps over the lazy dog. " * 3 + "Bye"]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    kw = dict(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, max_num_batched_tokens=24)
    want = [o.token_ids for o in LLMEngine(EngineConfig(**kw, attention_backend="reference")).generate(prompts, params)]
    for graphs in (False, True):
        eng = LLMEngine(EngineConfig(**kw, attention_backend="flex", cuda_graphs=graphs))
        assert [o.token_ids for o in eng.generate(prompts, params)] == want
        assert eng.runner.backend.flex.calls > 0
    assert eng.runner.graphs.num_runs > 0


def test_flex_only_when_asked_compiled_on_cuda_and_the_8_bit_cache_leaves_it(tiny_llama):
    """"native" on CUDA is the eager batched path: the first GPU run (an H200, torch 2.11) found the compiled
    FlexAttention still in inductor minutes into its first decode step."""
    from engine.loading.loader import load_hf_folder
    from engine.runner.attention_backend import select_backend

    mc = load_hf_folder(str(tiny_llama), lambda message, fraction: None).config
    native = select_backend("native", mc, torch.device("cuda", 0), torch.bfloat16, compile=False)
    assert native.flex is None and native.native_decode is None and not native.reference
    cuda = select_backend("flex", mc, torch.device("cuda", 0), torch.bfloat16, compile=False)
    assert cuda.flex is not None and cuda.flex.compiled and cuda.native_decode is None
    assert select_backend("fast", mc, torch.device("cuda", 0), torch.bfloat16, compile=False).flex is None
    cpu = select_backend("flex", mc, torch.device("cpu"), torch.float32, compile=False)
    assert cpu.flex is not None and not cpu.flex.compiled
    int8 = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=32, attention_backend="flex",
                                  kv_cache_dtype="int8"))
    assert int8.runner.backend.flex is None  # FlexAttention reads 16-bit caches


def test_a_failing_flex_kernel_turns_itself_off_and_the_tokens_stay(tiny_llama, monkeypatch):
    """On a GPU the compiled kernel may fail to build: the first failure disables it with a warning and
    the eager path serves that step and the rest, so a run still brings its figures back."""
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    kw = dict(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, max_num_batched_tokens=24)
    prompts = ["The quick brown fox jumps over the lazy dog. Hello", "a"]
    want = [o.token_ids for o in LLMEngine(EngineConfig(**kw, attention_backend="reference")).generate(prompts, params)]
    eng = LLMEngine(EngineConfig(**kw, attention_backend="flex"))

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this GPU")

    monkeypatch.setattr(eng.runner.backend.flex, "fn", broken)
    with pytest.warns(UserWarning, match="FlexAttention paged attention unavailable"):
        got = [o.token_ids for o in eng.generate(prompts, params)]
    assert got == want and eng.runner.backend.flex.fn is None and "no kernel" in eng.runner.backend.flex.error
