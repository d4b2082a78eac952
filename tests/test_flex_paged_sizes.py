"""FlexAttention's paged block mask sized by the step's block table, not the cache's page count
(engine/models/layers/flex_paged.py): the mask and its mask function's tensors keep their shapes whatever
the cache's size, so a decode graph's memory does not depend on it (engine/runner/graphs.py). Checked on
the CPU against the reference attention, at several context lengths, cache sizes and batch buckets."""
from __future__ import annotations

import math

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.models.layers import flex_paged
from engine.models.layers.attention import AttentionMetadata, DecodeGroup, paged_attention_reference
from engine.runner.graphs import context_bucket

pytestmark = [pytest.mark.skipif(not flex_paged.available(), reason="this torch has no FlexAttention"),
              pytest.mark.filterwarnings("ignore::UserWarning")]  # "flex_attention called without compile"
BS, KV_HEADS, HEADS, HEAD_DIM = 4, 2, 4, 16
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = ["The quick brown fox jumps over the lazy dog. " * 2 + "Hello", "a", "Paged attention stores keys"]


def _mask_tensors(mask) -> list[torch.Tensor]:
    """Every tensor a BlockMask holds, its mask function's captured ones included."""
    fields = [getattr(mask, name) for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks",
                                               "full_kv_indices", "q_num_blocks", "q_indices")]
    cells = [c.cell_contents for c in mask.mask_mod.__closure__ or ()]
    return [t for t in fields + cells if isinstance(t, torch.Tensor)]


def _random_tables(lens: list[int], num_pages: int, seed: int) -> list[list[int]]:
    """Disjoint pages, out of order, for contexts of `lens` tokens."""
    pages = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed)).tolist()
    tables, at = [], 0
    for n in lens:
        k = -(-n // BS)
        tables.append(pages[at:at + k])
        at += k
    return tables


def _padded(tables: list[list[int]], width: int) -> torch.Tensor:
    return torch.tensor([t + [0] * (width - len(t)) for t in tables])  # padded with page 0, as the graphs do


@pytest.mark.parametrize("num_pages", [64, 1_000_000])
def test_the_mask_holds_nothing_as_wide_as_the_cache(num_pages):
    """The same step over a 64-page and a million-page cache: the same tensors, none of the cache's width."""
    tables = _padded([[3, 7, 1], [5, 0], [2, 9, 4, 11]], 4)
    mask = flex_paged.paged_block_mask(tables, torch.tensor([10, 5, 16]), 1, num_pages * BS, BS)
    shapes = sorted(tuple(t.shape) for t in _mask_tensors(mask))
    small = flex_paged.paged_block_mask(tables, torch.tensor([10, 5, 16]), 1, 64 * BS, BS)
    assert shapes == sorted(tuple(t.shape) for t in _mask_tensors(small))
    assert max(max(s) for s in shapes) == flex_paged.MIN_SEARCH_WIDTH  # the search's floor, not num_pages
    assert mask.shape[-1] == num_pages * BS  # the cache's length is a number of the mask, not a tensor


@pytest.mark.parametrize("q_len", [1, 7, 130])
def test_the_mask_function_and_the_listed_pages_match_the_tables_exactly(q_len):
    """The mask function on every (query, slot) pair of the cache against the tables, and the pages each
    query block lists (what the block-sparse GPU kernel visits) against the pages its queries see."""
    from torch.nn.attention.flex_attention import create_mask

    num_pages = 120
    lens = [150, 133, 9 + q_len]
    tables = _random_tables(lens, num_pages, seed=q_len)
    width = max(map(len, tables))
    mask = flex_paged.paged_block_mask(_padded(tables, width), torch.tensor(lens), q_len, num_pages * BS, BS)
    got = create_mask(mask.mask_mod, len(lens), 1, q_len, num_pages * BS, device="cpu")[:, 0]  # (B, q, slots)
    want = torch.zeros_like(got)
    for b, (table, n) in enumerate(zip(tables, lens)):
        for q in range(q_len):
            for pos in range(n - q_len + q + 1):
                want[b, q, table[pos // BS] * BS + pos % BS] = True
    assert torch.equal(got, want)
    for b in range(len(lens)):
        for m in range(-(-q_len // flex_paged.Q_BLOCK)):
            listed = mask.kv_indices[b, 0, m, : mask.kv_num_blocks[b, 0, m]].tolist()
            rows = want[b, m * flex_paged.Q_BLOCK:(m + 1) * flex_paged.Q_BLOCK]
            seen = sorted({int(s) // BS for s in rows.any(0).nonzero().flatten()})
            assert sorted(listed) == seen and len(set(listed)) == len(listed)


@pytest.mark.parametrize("spare_pages", [3, 2000])
@pytest.mark.parametrize("lens", [[1], [5, 17, 2], [30, 64, 9, 1, 44, 3, 16, 50], [1100, 3]],
                         ids=["1-row", "3-rows", "8-rows", "wider-than-the-search-floor"])
def test_flex_decode_gives_the_reference_attention(lens, spare_pages):
    """Decode rows padded to a batch bucket's table width (a power of two of pages); the last case's
    context spans 275 pages, more than MIN_SEARCH_WIDTH: its search runs over 512 entries."""
    num_pages = sum(-(-n // BS) for n in lens) + spare_pages  # a cache just large enough, and a large one
    torch.manual_seed(len(lens))
    k_cache, v_cache = (torch.randn(KV_HEADS, num_pages * BS, HEAD_DIM) for _ in range(2))
    tables = _random_tables(lens, num_pages, seed=num_pages)
    width = context_bucket(max(map(len, tables)))
    q = torch.randn(len(lens), HEADS, HEAD_DIM)
    group = DecodeGroup(0, len(lens), width * BS, _padded(tables, width).reshape(-1), None, torch.tensor(lens))
    got = flex_paged.FlexPaged(compiled=False).decode(q, k_cache, v_cache, group, BS, 1 / math.sqrt(HEAD_DIM))
    md = AttentionMetadata(slot_mapping=torch.zeros(len(lens), dtype=torch.long), num_decode_tokens=0, block_size=BS,
                           seqs=[(i, 1, n, t) for i, (n, t) in enumerate(zip(lens, tables))])
    want = paged_attention_reference(q, k_cache, v_cache, md, 1 / math.sqrt(HEAD_DIM))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _graph_bytes(eng: LLMEngine) -> tuple[int, list[tuple[int, ...]]]:
    """The static buffers' bytes of every built bucket, and the shapes of the last step's block mask."""
    steps = eng.runner.graphs._steps.values()
    static = sum(t.numel() * t.element_size() for st in steps
                 for t in (st.ids, st.positions, st.slots, st.blocks, st.ctx_lens, st.mask))
    masks = [st.md.decode_groups[0].flex_mask for st in steps if st.md.decode_groups[0].flex_mask is not None]
    return static, sorted(tuple(t.shape) for m in masks for t in _mask_tensors(m))


def test_graph_buffers_do_not_change_with_the_cache_size_nor_after_a_resize(tiny_llama):
    """Two engines, 48 and 6000 blocks: the same buckets, the same static bytes, the same block-mask
    shapes, and the reference tokens; then the small one's cache grows to 3000 blocks (its graphs are
    dropped, the next steps build buckets again): the large one, its graphs dropped too, builds the same."""
    kw = dict(model=str(tiny_llama), dtype="float32", block_size=BS, max_num_seqs=4, max_model_len=128)
    want = [o.token_ids for o in LLMEngine(EngineConfig(**kw, num_kv_blocks=48, attention_backend="reference"))
            .generate(PROMPTS, GREEDY)]
    engines = [LLMEngine(EngineConfig(**kw, num_kv_blocks=n, attention_backend="flex", cuda_graphs=True))
               for n in (48, 6000)]
    built = [_graph_bytes(e)[0] for e in engines]
    assert built[0] == built[1] > 0
    for eng in engines:
        assert [o.token_ids for o in eng.generate(PROMPTS, GREEDY)] == want
        assert eng.runner.graphs.num_runs > 0
    small, large = (_graph_bytes(e) for e in engines)
    assert small == large and small[1]  # a mask was built in a graph's buffers
    small_eng, large_eng = engines
    small_eng.weights.kv_target = 3000  # what a requantization sets: the next step grows the cache
    large_eng.runner.invalidate_graphs()
    for eng in engines:
        assert [o.token_ids for o in eng.generate(PROMPTS, GREEDY)] == want
    assert small_eng.runner.kv_caches[0][0].shape[1] == 3000 * BS  # resized, its graphs dropped and built again
    assert _graph_bytes(small_eng) == _graph_bytes(large_eng)
