"""Paged attention through FlexAttention (torch.nn.attention.flex_attention) with a paged block mask:
decode steps and prefill chunks over a cached context read K/V where the block tables say they lie, a
page at a time, with no gather into a padded copy.

The caches are one batch of slots, (1, kv_heads, num_blocks * block_size, head_dim); each query row
(batch b) is told which pages are its own by the block mask: one KV block of the mask is one page of
the cache (KV_BLOCK_SIZE = block_size), and row b visits exactly the pages of its block table (up to
its queries' last position). The mask function keeps what row b may see: a page of b's table, at its
logical index times block_size plus the offset, at or before the query's position; it finds the page's
logical index by a binary search in b's sorted table.
It is exact on every (query, slot) pair, so an implementation that applies it everywhere (the eager one,
on the CPU) gives the same result as the block-sparse kernel. Every tensor the mask holds is as wide as
the step's block table (in a CUDA graph: the context bucket), never as the cache: its size, and a
graph's, does not change with the number of KV blocks.

On CUDA the function is compiled (torch.compile: Triton's flex decoding and flex attention kernels);
on the CPU the tests run it eagerly against the reference attention. Used only where asked for
(attention_backend="flex"): on the first GPU run its compile had not finished 20 s into the first decode.
"""
from __future__ import annotations

import torch

Q_BLOCK = 128  # the mask's query block: one block for a decode row, a few for a prefill chunk
_NO_PAGE = 2**30  # sorts after every page index; matches no slot's page
# The binary search runs over a power of two of entries, at least this many: its step count is part of the
# compiled kernel, so every table up to 256 pages shares one (a recompile only per doubling beyond)
MIN_SEARCH_WIDTH = 256


def available() -> bool:
    """FlexAttention with a block mask built from KV blocks alone (compute_q_blocks, torch 2.9+): the
    transposed (query-block) lists it would otherwise build need a column per page of the whole cache."""
    import inspect

    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: F401
    except ImportError:
        return False
    return "compute_q_blocks" in inspect.signature(BlockMask.from_kv_blocks).parameters


class FlexPaged:
    """FlexAttention over the paged cache, compiled on CUDA (`compiled`), eager elsewhere."""

    def __init__(self, compiled: bool) -> None:
        from torch.nn.attention.flex_attention import flex_attention

        self.compiled = compiled
        self.fn = torch.compile(flex_attention, dynamic=True) if compiled else flex_attention  # None: disabled
        self.calls = 0  # the tests check this path ran
        self.error: str | None = None  # why it was disabled

    def disable(self, reason: str) -> None:
        """The first failure (a kernel this GPU or torch cannot build, say) turns it off with one warning:
        the eager path serves from then on, so a run brings back figures instead of ending."""
        import warnings

        warnings.warn(f"FlexAttention paged attention unavailable, using the eager path: {reason}", stacklevel=3)
        self.fn, self.error = None, reason

    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, group, block_size: int,
               scale: float) -> torch.Tensor:
        """q (n, heads, head_dim), one row per sequence of the DecodeGroup `group` at its last position
        (its blocks: (n * max_blocks,) tables, padding never read; its ctx_lens). Returns (n, heads, head_dim).
        The block mask is built by the step's first layer and kept on the group for the others."""
        n = q.shape[0]
        if group.flex_mask is None:
            group.flex_mask = paged_block_mask(group.blocks.view(n, -1), group.ctx_lens, 1, k_cache.shape[1],
                                               block_size)
        return self._attend(q.unsqueeze(2), k_cache, v_cache, group.flex_mask, block_size, scale).squeeze(2)

    def prefill(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq, block_size: int,
                scale: float) -> torch.Tensor:
        """A chunk (PrefillSeq `seq`) of q_len rows (q_len, heads, head_dim) at the end of its context of
        ctx_len tokens (its own K/V already written), causal. Returns (q_len, heads, head_dim)."""
        if seq.flex_mask is None:
            lens = torch.tensor([seq.ctx_len], device=q.device)
            seq.flex_mask = paged_block_mask(seq.blocks.view(1, -1), lens, seq.q_len, k_cache.shape[1], block_size)
        out = self._attend(q.transpose(0, 1).unsqueeze(0), k_cache, v_cache, seq.flex_mask, block_size, scale)
        return out.squeeze(0).transpose(0, 1)

    def _attend(self, q4: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask, block_size: int,
                scale: float) -> torch.Tensor:
        """q4 (B, heads, q_len, head_dim), the last q_len positions of each row's context."""
        kwargs = {"kernel_options": {"BLOCK_N": block_size}} if self.compiled and block_size < 64 else {}
        out = self.fn(q4, k_cache.unsqueeze(0), v_cache.unsqueeze(0), block_mask=mask, scale=scale,
                      enable_gqa=True, **kwargs)
        self.calls += 1
        return out


def paged_block_mask(tables: torch.Tensor, ctx_lens: torch.Tensor, q_len: int, num_slots: int, block_size: int):
    """The BlockMask of rows whose contexts lie in the pages of `tables` (B, width); every row's queries
    are the last q_len positions of its context of ctx_lens[b] tokens. Every tensor it holds is (B,),
    (B, 1, query blocks), (B, 1, query blocks, width) or (B, search width), the search width being
    max(MIN_SEARCH_WIDTH, width to a power of two): sized by the step's table, never by the cache's page
    count (num_slots only sets the mask's logical length, a number)."""
    from torch.nn.attention.flex_attention import BlockMask

    dev = tables.device
    batch, width = tables.shape
    lens = ctx_lens.to(dev)
    n_blocks = (lens + block_size - 1) // block_size  # (B,)
    q_base = (lens - q_len).to(torch.int32)  # (B,) position of each row's first query
    logical = torch.arange(width, device=dev, dtype=torch.int32).expand(batch, -1)
    pages = torch.where(logical < n_blocks.unsqueeze(1), tables.to(torch.int32), _NO_PAGE)  # padding: never a page
    search = max(MIN_SEARCH_WIDTH, 1 << (width - 1).bit_length())
    padded = torch.nn.functional.pad(pages, (0, search - width), value=_NO_PAGE)
    sorted_pages, order = padded.sort(dim=1)  # the mask function finds a page by binary search in its row
    visible = _visible_fn(sorted_pages, order.to(torch.int32), q_base, block_size)
    num_q_blocks = -(-q_len // Q_BLOCK)
    kv_num_blocks, kv_indices = _kv_blocks(pages, n_blocks, q_base, q_len, num_q_blocks, block_size)
    return BlockMask.from_kv_blocks(kv_num_blocks, kv_indices, BLOCK_SIZE=(Q_BLOCK, block_size),
                                    mask_mod=visible, seq_lengths=(q_len, num_slots), compute_q_blocks=False)


def _visible_fn(sorted_pages: torch.Tensor, sorted_logical: torch.Tensor, q_base: torch.Tensor, block_size: int):
    """mask_mod: slot kv_idx is visible to row b's query q_idx when its page is one of b's (found by a
    branchless binary search over b's sorted pages, padded to a power of two: log2 of it steps) and
    its logical position (the page's index in b's table, times block_size, plus the offset) is at or before
    the query's. Exact on every (query, slot) pair, so the eager implementation (which applies it to the
    whole cache) and the block-sparse kernel (which applies it to the pages the block mask lists) agree."""
    strides = [1 << i for i in reversed(range((sorted_pages.shape[1] - 1).bit_length()))]  # sum: the width - 1

    def visible(b, h, q_idx, kv_idx):
        page = kv_idx // block_size
        pos = page * 0  # the last index whose page is <= this one (0 if none)
        for stride in strides:
            ahead = pos + stride
            pos = torch.where(sorted_pages[b, ahead] <= page, ahead, pos)
        owned = sorted_pages[b, pos] == page
        return owned & (sorted_logical[b, pos] * block_size + kv_idx % block_size <= q_base[b] + q_idx)

    return visible


def _kv_blocks(pages: torch.Tensor, n_blocks: torch.Tensor, q_base: torch.Tensor, q_len: int, num_q_blocks: int,
               block_size: int):
    """Per query block m of each row: the pages it may see, in table order (B, 1, M, width), and their
    count (B, 1, M): the row's table up to the page of the block's last query. All are listed as partial
    blocks (the mask function runs on each): torch's flex decoding kernel splits full blocks by the whole
    KV length (the cache's), partial ones by each row's own count."""
    dev = pages.device
    batch, width = pages.shape
    m = torch.arange(num_q_blocks, device=dev, dtype=torch.int32)
    last = q_base.unsqueeze(1) + torch.clamp((m + 1) * Q_BLOCK, max=q_len) - 1  # (B, M) each block's last query
    n_seen = torch.minimum(last // block_size + 1, n_blocks.unsqueeze(1)).to(torch.int32)
    table = pages.masked_fill(pages == _NO_PAGE, 0)  # padding: page 0, past each row's count (never visited)
    indices = table.view(batch, 1, 1, width).expand(batch, 1, num_q_blocks, width).contiguous()
    return n_seen.unsqueeze(1), indices
