"""Block manager: exact block ids, ref counts, prefix hits, eviction order, copy-on-write."""
from __future__ import annotations

from engine.core.block_manager import BlockManager

BS = 4


def toks(n, start=0):
    return list(range(start, start + n))


def test_allocate_hands_out_blocks_in_order_and_free_returns_them():
    bm = BlockManager(8, BS)
    assert bm.allocate("a", toks(10), 10) == 0
    assert bm.block_table("a") == [0, 1, 2]
    assert bm.allocate("b", toks(5, 100), 5) == 0
    assert bm.block_table("b") == [3, 4]
    assert bm.num_free_blocks == 3
    bm.free("b")  # nothing committed: worthless blocks go to the front, tail first
    assert bm.free_block_order()[:2] == [3, 4]


def test_ensure_slots_grows_one_block_at_a_boundary():
    bm = BlockManager(8, BS)
    bm.allocate("a", toks(4), 4)
    assert bm.block_table("a") == [0]
    ok, copies = bm.ensure_slots("a", 4, 5)
    assert ok and copies == [] and bm.block_table("a") == [0, 1]
    ok, _ = bm.ensure_slots("a", 5, 8)
    assert bm.block_table("a") == [0, 1]


def test_out_of_blocks_changes_nothing():
    bm = BlockManager(3, BS)
    bm.allocate("a", toks(8), 8)
    assert bm.allocate("b", toks(9, 50), 9) is None
    assert bm.block_table("b") == [] and bm.num_free_blocks == 1
    ok, _ = bm.ensure_slots("a", 8, 13)
    assert not ok and bm.block_table("a") == [0, 1]


def test_prefix_cache_hit_shares_blocks_and_leaves_last_token():
    bm = BlockManager(10, BS)
    prompt = toks(12)
    bm.allocate("a", prompt, 12)
    bm.commit("a", prompt, 12)
    # Same 8-token prefix: two full blocks are shared; the third block differs.
    other = toks(8) + [90, 91, 92]
    assert bm.allocate("b", other, 11) == 8
    assert bm.block_table("b")[:2] == [0, 1]
    assert bm.block_table("b")[2] == 3
    assert bm.ref_count(0) == 2 and bm.ref_count(2) == 1
    # An identical prompt reuses only 2 of its 3 full blocks: the last token must be computed.
    assert bm.allocate("c", prompt, 12) == 8
    assert bm.num_cache_hit_blocks == 4


def test_freed_cached_blocks_are_hit_later_and_evicted_last_lru():
    bm = BlockManager(6, BS)
    pa, pb = toks(8), toks(8, 40)
    bm.allocate("a", pa, 8)
    bm.commit("a", pa, 8)
    bm.allocate("b", pb, 8)
    bm.commit("b", pb, 8)
    bm.allocate("c", toks(6, 80), 6)  # uncommitted blocks 4, 5
    bm.free("a")  # cached blocks go to the back, tail first: 1, 0
    bm.free("c")  # worthless blocks go to the front: 5, 4 then
    bm.free("b")  # 3, 2 at the back
    assert bm.free_block_order() == [4, 5, 1, 0, 3, 2]
    assert bm.num_cached_free_blocks == 4
    # a hit on a's prefix takes its blocks back out of the free queue
    assert bm.allocate("a2", pa + [1], 9) == 8
    assert bm.block_table("a2") == [0, 1, 4]
    assert bm.free_block_order() == [5, 3, 2]
    # pressure: allocating 3 fresh blocks evicts the worthless one first, then b's blocks, LRU
    bm.allocate("d", toks(12, 200), 12)
    assert bm.block_table("d") == [5, 3, 2]
    assert bm.cached_prefix(pb + [1]) == []  # b's prefix was evicted
    assert bm.cached_prefix(pa + [1]) == [0, 1]


def test_resize_grows_at_the_front_and_shrinks_only_free_top_blocks():
    bm = BlockManager(4, BS)
    pa = toks(8)
    bm.allocate("a", pa, 8)
    bm.commit("a", pa, 8)  # blocks 0, 1 hold a's prefix
    bm.allocate("b", toks(4, 50), 4)  # block 2
    assert bm.resize(7) == 7
    assert bm.free_block_order() == [4, 5, 6, 3]  # new empty blocks are handed out before old ones
    bm.free("a")  # 1, 0 cached at the back
    assert bm.resize(2) == 3  # block 2 is in use: the shrink stops above it
    assert bm.free_block_order() == [1, 0] and bm.num_blocks == 3
    assert bm.cached_prefix(pa + [1]) == [0, 1]
    bm.free("b")
    assert bm.resize(1) == 1  # now it goes all the way; block 1's cached prefix is forgotten
    assert bm.free_block_order() == [0] and bm.cached_prefix(pa + [1]) == [0]
    assert bm.allocate("c", toks(4, 90), 4) == 0 and bm.block_table("c") == [0]


def test_reset_prefix_cache_forgets_free_blocks_only():
    bm = BlockManager(6, BS)
    pa, pb = toks(8), toks(8, 40)
    for rid, p in (("a", pa), ("b", pb)):
        bm.allocate(rid, p, 8)
        bm.commit(rid, p, 8)
    bm.free("a")
    bm.reset_prefix_cache()
    assert bm.cached_prefix(pa + [1]) == [] and bm.cached_prefix(pb + [1]) == [2, 3]  # b still runs
    assert bm.num_cached_free_blocks == 0


def test_fork_then_copy_on_write():
    bm = BlockManager(8, BS)
    bm.allocate("p", toks(6), 6)
    bm.fork("p", "c")
    assert bm.block_table("c") == [0, 1] and bm.ref_count(1) == 2
    # the child writes token 6 into shared block 1: it gets its own copy
    ok, copies = bm.ensure_slots("c", 6, 7)
    assert ok and copies == [(1, 2)]
    assert bm.block_table("c") == [0, 2] and bm.ref_count(1) == 1 and bm.ref_count(0) == 2
    # the parent now owns block 1 alone and writes in place
    ok, copies = bm.ensure_slots("p", 6, 7)
    assert ok and copies == []
    bm.free("c")
    assert bm.ref_count(0) == 1 and bm.ref_count(2) == 0


def test_truncate_returns_speculative_blocks():
    bm = BlockManager(8, BS)
    bm.allocate("a", toks(6), 6)
    bm.ensure_slots("a", 6, 13)
    assert bm.block_table("a") == [0, 1, 2, 3]
    bm.truncate("a", 7)
    assert bm.block_table("a") == [0, 1] and bm.free_block_order()[:2] == [2, 3]


def test_snapshot_reports_owners_refs_and_cached():
    bm = BlockManager(6, BS)
    p = toks(9)
    bm.allocate("a", p, 9)
    bm.commit("a", p, 9)
    bm.allocate("b", p[:8] + [77], 9)
    snap = bm.snapshot()
    info = {b.block_id: b for b in snap.blocks}
    assert info[0].ref_count == 2 and set(info[0].owners) == {"a", "b"} and info[0].cached
    assert info[2].ref_count == 1 and not info[2].cached
    assert snap.block_tables == {"a": (0, 1, 2), "b": (0, 1, 3)}


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_ops = st.lists(st.tuples(st.sampled_from(["alloc", "grow", "commit", "free", "fork"]),
                          st.integers(0, 5), st.integers(1, 40), st.integers(0, 2)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(_ops)
def test_random_operations_never_lose_or_double_count_blocks(ops):
    bm = BlockManager(24, BS)
    live: dict[str, list[int]] = {}  # request -> its tokens
    computed: dict[str, int] = {}
    for op, who, n, prefix in ops:
        rid = f"r{who}"
        if op == "alloc" and rid not in live:
            tokens = [prefix] * 8 + list(range(n))  # a few shared prefixes, so cache hits happen
            got = bm.allocate(rid, tokens, len(tokens))
            if got is not None:
                live[rid], computed[rid] = tokens, len(tokens)
        elif op == "grow" and rid in live:
            ok, _ = bm.ensure_slots(rid, computed[rid], computed[rid] + n % 7 + 1)
            if ok:
                computed[rid] += n % 7 + 1
                live[rid] = live[rid] + [n] * (n % 7 + 1)
        elif op == "commit" and rid in live:
            bm.commit(rid, live[rid], computed[rid])
        elif op == "free" and rid in live:
            bm.free(rid)
            del live[rid], computed[rid]
        elif op == "fork" and rid in live and f"{rid}f" not in live:
            bm.fork(rid, f"{rid}f")
            live[f"{rid}f"], computed[f"{rid}f"] = list(live[rid]), computed[rid]
        # invariants: every block is free xor referenced; ref counts equal table occurrences
        refs = [0] * bm.num_blocks
        for r in live:
            for b in bm.block_table(r):
                refs[b] += 1
        assert refs == [bm.ref_count(b) for b in range(bm.num_blocks)]
        free = set(bm.free_block_order())
        assert free == {b for b in range(bm.num_blocks) if refs[b] == 0}
        for r in live:
            assert len(bm.block_table(r)) * BS >= computed[r]
    for r in list(live):
        bm.free(r)
    assert bm.num_free_blocks == bm.num_blocks
