"""The decode rows' block tables kept across steps (engine/runner/input_batch.py, issue 46 point 4):
after any sequence of allocations, growth, copy-on-write forks, truncations, frees and preemptions, the
rows a step reads equal tables built afresh; and an all-decode step's inputs from them equal the inputs
built from lists."""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.core.block_manager import BlockManager
from engine.runner import model_runner
from engine.runner.input_batch import BlockTables, host_ints

ops = st.lists(st.tuples(st.sampled_from(["add", "grow", "fork", "write", "truncate", "free", "step"]),
                         st.integers(0, 10**6), st.integers(1, 40)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=ops, prefix_caching=st.booleans())
def test_rows_equal_fresh_tables_after_any_history(ops, prefix_caching):
    bm, tables = BlockManager(48, 4, prefix_caching), BlockTables()
    live: dict[str, int] = {}  # request id -> tokens its table covers
    names = iter(f"r{i}" for i in range(10**6))
    for op, pick, n in ops:
        ids = sorted(live)
        rid = ids[pick % len(ids)] if ids else None
        if op == "add" or rid is None:
            new = next(names)
            tokens = [pick % 7] * n  # repeated prompts: prefix-cache hits share blocks
            if bm.allocate(new, tokens, n) is not None:
                bm.commit(new, tokens, n)
                live[new] = n
        elif op == "grow":
            if bm.ensure_slots(rid, live[rid], live[rid] + n % 9)[0]:
                live[rid] += n % 9
        elif op == "fork" and bm.num_free_blocks:
            child = next(names)
            bm.fork(rid, child)
            live[child] = live[rid]
        elif op == "write":  # rewrite the last position: a block shared since a fork is copied first
            bm.ensure_slots(rid, live[rid] - 1, live[rid])
        elif op == "truncate":
            live[rid] = max(1, live[rid] - n % 9)
            bm.truncate(rid, live[rid])
        elif op == "free":
            bm.free(rid)
            del live[rid]
        if live:  # a step over a random subset, in a random order
            chosen = random.Random(pick).sample(sorted(live), k=1 + pick % len(live))
            rows = tables.rows(chosen, bm)
            assert len(set(rows)) == len(rows)
            width = tables.table.shape[1]
            for r, row in zip(chosen, rows):
                table = bm.block_table(r)
                assert tables.table[row].tolist() == table + [0] * (width - len(table))


def test_host_ints_is_torch_tensor():
    for values in ([], [0], [3, -1, 2**62], list(range(1000))):
        assert torch.equal(host_ints(values), torch.tensor(values, dtype=torch.int64))


def same_inputs(a, b) -> None:
    ids_a, pos_a, md_a = a
    ids_b, pos_b, md_b = b
    assert torch.equal(ids_a, ids_b) and torch.equal(pos_a, pos_b)
    assert torch.equal(md_a.slot_mapping, md_b.slot_mapping) and md_a.num_decode_tokens == md_b.num_decode_tokens
    assert len(md_a.decode_groups) == len(md_b.decode_groups) and not md_a.prefills and not md_b.prefills
    for g, h in zip(md_a.decode_groups, md_b.decode_groups):
        assert (g.start, g.num_seqs, g.max_ctx) == (h.start, h.num_seqs, h.max_ctx)
        assert torch.equal(g.blocks, h.blocks) and torch.equal(g.ctx_lens, h.ctx_lens)
        assert (g.mask is None) == (h.mask is None) and (g.mask is None or torch.equal(g.mask, h.mask))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decode_steps_inputs_equal_the_lists_path(tiny_llama, seed, monkeypatch):
    """A running engine whose requests come, finish, are aborted and preempted (a cache of 40 blocks of 4):
    every all-decode step's inputs from the kept tables equal those built from lists."""
    monkeypatch.setattr(model_runner, "KEPT_TABLES_MIN_ROWS", 1)  # every all-decode step, however few rows
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=40, block_size=4,
                                 max_num_seqs=8, attention_backend="fast"))
    runner, checked = eng.runner, []
    real = runner._prepare_decodes

    def both(order, bm):
        fast = real(order, bm)
        same_inputs(fast, runner._prepare_lists(order, bm))
        checked.append(len(order))
        return fast

    runner._prepare_decodes = both
    rng = random.Random(seed)
    ids = []
    for _ in range(120):
        if rng.random() < 0.3:
            ids.append(eng.add_request([rng.randrange(300) for _ in range(rng.randrange(1, 12))],
                                       SamplingParams(max_tokens=rng.randrange(2, 40), temperature=0.0,
                                                      ignore_eos=True)))
        if ids and rng.random() < 0.05:
            eng.abort(ids.pop(rng.randrange(len(ids))))
        eng.step()
    assert len(checked) > 20 and max(checked) > 3
    assert eng.scheduler.num_preemptions > 0  # the cache was tight enough to preempt
