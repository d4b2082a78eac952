"""Paged KV blocks: free list, ref counts, block tables, prefix caching, copy-on-write.

The KV cache is cut into fixed-size blocks (``block_size`` tokens each). A request's block table lists,
in order, the physical block holding each chunk of its tokens. Full blocks are registered in a prefix
cache under a chained hash (the hash of a block covers every token before it), so two requests that
begin with the same tokens point at the same physical blocks. A block whose ref count drops to zero goes
back to the free queue but keeps its contents and hash until it is reused: a later request with the same
prefix can take it back (a cache hit). Eviction takes from the front of the free queue: blocks holding
nothing reusable first, then cached blocks least recently freed first.

Only counts and ids live here; the model runner owns the tensors and performs the copies this class
asks for (copy-on-write).
"""
from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence

from engine.events import BlockInfo, BlockMapSnapshot

_ROOT_HASH = 0x1F2E3D4C
# Table versions, unique across every BlockManager of the process: a (request id, version) pair names one
# content of one table, so a runner that keeps tables across steps (engine/runner/input_batch.py) rewrites a
# row only when its version moved, whichever block manager the request's table came from.
_VERSIONS = itertools.count(1)


def root_hash(lora_id: int = 0) -> int:
    """The hash the chain starts from: one per LoRA adapter, so two adapters never share a KV block
    (the same tokens give different K/V under different adapters)."""
    return _ROOT_HASH if not lora_id else hash((_ROOT_HASH, "lora", lora_id))


def hash_block_tokens(parent_hash: int, token_ids: Sequence[int]) -> int:
    """Chained hash of one full block: it depends on every token that came before."""
    return hash((parent_hash, tuple(token_ids)))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref_count = [0] * num_blocks
        self._block_hash: list[int | None] = [None] * num_blocks
        self._hash_to_block: dict[int, int] = {}
        # Free blocks in eviction order (front is taken first). Values are unused.
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._tables: dict[str, list[int]] = {}
        # Per request: how many leading blocks are registered in the prefix cache.
        self._num_hashed: dict[str, int] = {}
        self._last_hash: dict[str, int] = {}
        self._version: dict[str, int] = {}  # per request: changes whenever its table does
        self.num_cache_hit_blocks = 0  # cumulative, for stats()

    # ---- queries -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a reusable prefix."""
        return sum(1 for b in self._free if self._block_hash[b] is not None)

    def block_table(self, request_id: str) -> list[int]:
        return self._tables.get(request_id, [])

    def table_version(self, request_id: str) -> int:
        """A number that changes whenever the request's table does (a block appended, copied on write,
        truncated; the table dropped and made again); 0 when it has none. Unique across block managers."""
        return self._version.get(request_id, 0)

    def ref_count(self, block_id: int) -> int:
        return self._ref_count[block_id]

    def free_block_order(self) -> list[int]:
        """The order in which free blocks would be handed out (eviction order)."""
        return list(self._free)

    def blocks_needed(self, request_id: str, num_tokens: int) -> int:
        have = len(self._tables.get(request_id, ()))
        return max(0, -(-num_tokens // self.block_size) - have)

    def cached_prefix(self, token_ids: Sequence[int], lora_id: int = 0) -> list[int]:
        """Blocks already holding a prefix of ``token_ids`` (full blocks only; no side effects).

        At least one token is always left to compute, because the model needs a fresh pass to
        produce the next token's logits.
        """
        if not self.enable_prefix_caching:
            return []
        blocks: list[int] = []
        parent = root_hash(lora_id)
        max_blocks = (len(token_ids) - 1) // self.block_size
        for i in range(max_blocks):
            h = hash_block_tokens(parent, token_ids[i * self.block_size : (i + 1) * self.block_size])
            block = self._hash_to_block.get(h)
            if block is None:
                break
            blocks.append(block)
            parent = h
        return blocks

    def can_allocate(self, request_id: str, num_tokens: int, cached_blocks: Sequence[int] = ()) -> bool:
        """Could the table of ``request_id`` cover ``num_tokens`` after taking ``cached_blocks``?"""
        have = len(self._tables.get(request_id, ())) + len(cached_blocks)
        need = max(0, -(-num_tokens // self.block_size) - have)
        # Cached blocks sitting in the free queue stop being free when taken.
        taken_from_free = sum(1 for b in cached_blocks if self._ref_count[b] == 0)
        return need <= len(self._free) - taken_from_free

    # ---- verbs ---------------------------------------------------------------------------------
    def resize(self, num_blocks: int) -> int:
        """Grow to ``num_blocks`` (the new, empty blocks are handed out first), or shrink as far as the
        blocks above the new end are free (a cached prefix there is forgotten). Returns the new count;
        a shrink blocked by blocks in use can be retried once they are freed."""
        old = self.num_blocks
        if num_blocks > old:
            self._ref_count += [0] * (num_blocks - old)
            self._block_hash += [None] * (num_blocks - old)
            for b in range(num_blocks - 1, old - 1, -1):
                self._free[b] = None
                self._free.move_to_end(b, last=False)
        else:
            end = old
            while end > max(num_blocks, 1) and (end - 1) in self._free:
                end -= 1
            for b in range(end, old):
                h = self._block_hash[b]
                if h is not None and self._hash_to_block.get(h) == b:
                    del self._hash_to_block[h]
                del self._free[b]
            del self._ref_count[end:], self._block_hash[end:]
        self.num_blocks = len(self._ref_count)
        return self.num_blocks

    def allocate(self, request_id: str, token_ids: Sequence[int], num_tokens: int,
                 use_prefix_cache: bool = True, lora_id: int = 0) -> int | None:
        """Start a table for a new (or preempted) request: reuse its cached prefix, then allocate
        fresh blocks so the table covers ``num_tokens``. Returns the number of prefix tokens found in
        the cache, or None when there are not enough free blocks (nothing is changed then)."""
        assert request_id not in self._tables, f"{request_id} already has blocks"
        cached = self.cached_prefix(token_ids, lora_id) if use_prefix_cache else []
        num_tokens = max(num_tokens, len(cached) * self.block_size)
        if not self.can_allocate(request_id, num_tokens, cached):
            return None
        for b in cached:
            self._take(b)
        self._tables[request_id] = list(cached)
        self._num_hashed[request_id] = len(cached)
        self._last_hash[request_id] = self._block_hash[cached[-1]] if cached else root_hash(lora_id)
        self.num_cache_hit_blocks += len(cached)
        self._grow(request_id, num_tokens)
        self._version[request_id] = next(_VERSIONS)
        return len(cached) * self.block_size

    def ensure_slots(
        self, request_id: str, num_computed_tokens: int, num_tokens: int
    ) -> tuple[bool, list[tuple[int, int]]]:
        """Make the table cover ``num_tokens`` tokens, ready to write positions from
        ``num_computed_tokens`` on.

        Returns (ok, copies): copies are (src_block, dst_block) pairs the model runner must copy before
        writing, because the block the next write lands in was shared (copy-on-write after a fork).
        Nothing changes when ok is False.
        """
        table = self._tables[request_id]
        copies: list[tuple[int, int]] = []
        write_block = num_computed_tokens // self.block_size
        cow = write_block < len(table) and self._ref_count[table[write_block]] > 1
        need = max(0, -(-num_tokens // self.block_size) - len(table))
        if not need and not cow:  # most decode steps: the table covers the token, its block is its own
            return True, copies
        if need + int(cow) > len(self._free):
            return False, copies
        if cow:
            src = table[write_block]
            dst = self._pop_free()
            self._ref_count[src] -= 1
            table[write_block] = dst
            copies.append((src, dst))
            self._version[request_id] = next(_VERSIONS)
        self._grow(request_id, num_tokens)
        return True, copies

    def commit(self, request_id: str, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Register the request's newly completed full blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        table = self._tables[request_id]
        n_hashed = self._num_hashed[request_id]
        parent = self._last_hash[request_id]
        n_full = min(num_computed_tokens // self.block_size, len(table))
        for i in range(n_hashed, n_full):
            h = hash_block_tokens(parent, token_ids[i * self.block_size : (i + 1) * self.block_size])
            block = table[i]
            if h not in self._hash_to_block and self._block_hash[block] is None:
                self._hash_to_block[h] = block
                self._block_hash[block] = h
            parent = h
        self._num_hashed[request_id] = max(n_hashed, n_full)
        self._last_hash[request_id] = parent

    def free(self, request_id: str) -> None:
        """Drop a request's table. Blocks whose ref count reaches zero return to the free queue:
        worthless ones at the front, cached ones at the back (tail blocks before head blocks, so a
        shared prefix outlives the private ends of the conversations that used it)."""
        table = self._tables.pop(request_id, None)
        self._version.pop(request_id, None)
        self._num_hashed.pop(request_id, None)
        self._last_hash.pop(request_id, None)
        if table is None:
            return
        for b in reversed(table):
            self._ref_count[b] -= 1
            if self._ref_count[b] == 0:
                self._free[b] = None
                if self._block_hash[b] is None:
                    self._free.move_to_end(b, last=False)

    def uncache(self, request_id: str) -> None:
        """Take the blocks only this request holds out of the prefix cache (before freeing a request that
        failed: what it wrote may be wrong, e.g. NaN, and must not be served to another prompt). Blocks
        shared with others came from the cache, written by someone else, and stay."""
        for b in self._tables.get(request_id, ()):
            if self._ref_count[b] == 1:
                self._evict(b)

    def fork(self, parent_id: str, child_id: str) -> None:
        """The child shares every block of the parent; a later write to a shared block copies it."""
        table = self._tables[parent_id]
        for b in table:
            self._ref_count[b] += 1
        self._tables[child_id] = list(table)
        self._version[child_id] = next(_VERSIONS)
        self._num_hashed[child_id] = self._num_hashed[parent_id]
        self._last_hash[child_id] = self._last_hash[parent_id]

    def truncate(self, request_id: str, num_tokens: int) -> None:
        """Give back blocks beyond ``num_tokens`` (rejected speculative tokens)."""
        table = self._tables[request_id]
        keep = -(-num_tokens // self.block_size)
        if len(table) > keep:
            self._version[request_id] = next(_VERSIONS)
        while len(table) > keep:
            b = table.pop()
            self._ref_count[b] -= 1
            if self._ref_count[b] == 0:
                self._free[b] = None
                self._free.move_to_end(b, last=False)

    def reset_prefix_cache(self) -> None:
        for b in self._free:
            self._block_hash[b] = None
        self._hash_to_block = {h: b for h, b in self._hash_to_block.items() if self._ref_count[b] > 0}

    def snapshot(self) -> BlockMapSnapshot:
        owners: dict[int, list[str]] = {}
        for rid, table in self._tables.items():
            for b in table:
                owners.setdefault(b, []).append(rid)
        # only the blocks in a table or in the prefix cache, never a walk over every block (a large
        # GPU's cache has hundreds of thousands, nearly all free when the app is idle)
        infos = [BlockInfo(b, self._ref_count[b], self._block_hash[b] is not None, tuple(owners.get(b, ())))
                 for b in sorted(owners.keys() | set(self._hash_to_block.values()))]
        return BlockMapSnapshot(
            self.block_size,
            self.num_blocks,
            {rid: tuple(t) for rid, t in self._tables.items()},
            tuple(infos),
        )

    # ---- internals -----------------------------------------------------------------------------
    def _grow(self, request_id: str, num_tokens: int) -> None:
        table = self._tables[request_id]
        need = -(-num_tokens // self.block_size) - len(table)
        if need > 0:
            self._version[request_id] = next(_VERSIONS)
        for _ in range(need):
            table.append(self._pop_free())

    def _pop_free(self) -> int:
        block, _ = self._free.popitem(last=False)
        self._evict(block)
        self._ref_count[block] = 1
        return block

    def _take(self, block: int) -> None:
        """Take a cache hit: a free cached block leaves the free queue, a used one gains a ref."""
        if self._ref_count[block] == 0:
            del self._free[block]
        self._ref_count[block] += 1

    def _evict(self, block: int) -> None:
        h = self._block_hash[block]
        if h is not None:
            del self._hash_to_block[h]
            self._block_hash[block] = None
