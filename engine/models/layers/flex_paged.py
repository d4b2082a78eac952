"""Paged attention through FlexAttention (torch.nn.attention.flex_attention) with a paged block mask:
decode steps and prefill chunks over a cached context read K/V where the block tables say they lie, a
page at a time, with no gather into a padded copy.

The caches are one batch of slots, (1, kv_heads, num_blocks * block_size, head_dim); each query row
(batch b) is told which pages are its own by the block mask: one KV block of the mask is one page of
the cache (KV_BLOCK_SIZE = block_size), and row b visits exactly the pages of its block table. Inside
a page, the mask function keeps what row b may see: the page's logical index in b's table, from a
(batch, page) -> logical-block map built once a call, times block_size plus the offset, at or before
the query's position. The same function holds on every page, so an implementation that applies it to
every (query, slot) pair (the eager one, on the CPU) gives the same result as the block-sparse kernel.

On CUDA the function is compiled (torch.compile: Triton's flex decoding and flex attention kernels);
on the CPU the tests run it eagerly against the reference attention. Not yet run on a GPU.
"""
from __future__ import annotations

import torch

Q_BLOCK = 128  # the mask's query block: one block for a decode row, a few for a prefill chunk


def available() -> bool:
    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


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
    """The BlockMask of rows whose contexts lie in the pages of `tables` (B, max_blocks); every row's
    queries are the last q_len positions of its context of ctx_lens[b] tokens."""
    from torch.nn.attention.flex_attention import BlockMask

    dev = tables.device
    batch, max_blocks = tables.shape
    num_pages = num_slots // block_size
    n_blocks = (ctx_lens.to(dev) + block_size - 1) // block_size  # (B,)
    logical = torch.arange(max_blocks, device=dev, dtype=torch.int32).expand(batch, -1)
    owned = torch.where(logical < n_blocks.unsqueeze(1), tables.long(), num_pages)  # padding -> a spare column
    page_to_logical = torch.full((batch, num_pages + 1), -1, dtype=torch.int32, device=dev)
    page_to_logical.scatter_(1, owned, logical)
    q_base = (ctx_lens.to(dev) - q_len).to(torch.int32)  # (B,) position of each row's first query

    def visible(b, h, q_idx, kv_idx):
        page_logical = page_to_logical[b, kv_idx // block_size]
        return (page_logical >= 0) & (page_logical * block_size + kv_idx % block_size <= q_base[b] + q_idx)

    num_q_blocks = -(-q_len // Q_BLOCK)
    kv_num_blocks = n_blocks.to(torch.int32).view(batch, 1, 1).expand(batch, 1, num_q_blocks).contiguous()
    # the mask wants one column per KV block of the whole cache (it builds its transpose from them)
    columns = torch.zeros(batch, num_pages, dtype=torch.int32, device=dev)
    columns[:, :max_blocks] = tables.to(torch.int32)
    kv_indices = columns.view(batch, 1, 1, num_pages).expand(batch, 1, num_q_blocks, num_pages)
    return BlockMask.from_kv_blocks(kv_num_blocks, kv_indices.contiguous(), BLOCK_SIZE=(Q_BLOCK, block_size),
                                    mask_mod=visible, seq_lengths=(q_len, num_slots))
