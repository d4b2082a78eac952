"""The weights moved into huge-page arenas (engine/runner/huge_pages.py): same values, ties kept, views
and small tensors left alone, nothing moved twice; the engine's greedy tokens are the same with the
move and without, through a runtime requantization too. The speed is the bench's
(scripts/huge_pages_bench.py), not a test's."""
from __future__ import annotations

import ctypes
import os
import sys

import pytest
import torch
from torch import nn

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.perf.step_counter import storage_bytes
from engine.runner import huge_pages
from tests.conftest import build_tiny_model

needs_thp = pytest.mark.skipif(not huge_pages.available(), reason="no transparent huge pages to ask for here")


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(4096, 256)  # 4 MiB fp32
        self.head = nn.Linear(256, 4096, bias=False)
        self.head.weight = self.embed.weight  # tied, as in SmolLM2
        self.up = nn.Linear(256, 2048)  # 2 MiB weight, small bias
        self.norm = nn.LayerNorm(256)
        self.register_buffer("half_view", self.up.weight[:1024])  # a view into another tensor


@needs_thp
def test_move_keeps_values_ties_and_leaves_views_and_small_tensors():
    m = Tied()
    before = {k: v.detach().clone() for k, v in m.state_dict().items()}
    norm_ptr, bias_ptr = m.norm.weight.data_ptr(), m.up.bias.data_ptr()
    moved = huge_pages.move_to_huge_pages(m, min_bytes=1 << 20)
    assert moved == 4096 * 256 * 4 + 2048 * 256 * 4  # the tied table once, the up weight once
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert m.head.weight is m.embed.weight and m.head.weight.data_ptr() == m.embed.weight.data_ptr()
    assert m.embed.weight.data_ptr() % huge_pages.huge_page_bytes() == 0  # the arena starts on a huge page
    assert m.norm.weight.data_ptr() == norm_ptr and m.up.bias.data_ptr() == bias_ptr  # small: left
    assert huge_pages.move_to_huge_pages(m, min_bytes=1 << 20) == 0  # arena views are not moved again
    # the roofline's bytes per step count each tensor, not the arena it lies in
    assert storage_bytes(m.up) == m.up.weight.nbytes + m.up.bias.nbytes
    assert storage_bytes(nn.ModuleList([m.embed, m.head])) == m.embed.weight.nbytes  # tied: once
    out = m.head(m.up(torch.ones(1, 256))[:, :256])
    assert out.shape == (1, 4096) and torch.isfinite(out).all()


def test_switched_off_moves_nothing(monkeypatch):
    monkeypatch.setenv("INFERLAB_HUGE_PAGES", "0")
    m = Tied()
    ptr = m.embed.weight.data_ptr()
    assert not huge_pages.available()
    assert huge_pages.move_to_huge_pages(m, min_bytes=0) == 0 and m.embed.weight.data_ptr() == ptr


def test_thp_mode_reads_the_chosen_word(tmp_path, monkeypatch):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    monkeypatch.setattr(huge_pages, "THP_MODE", f)
    assert huge_pages.thp_mode() == "madvise"
    f.write_text("always madvise [never]\n")
    assert huge_pages.thp_mode() == "never" and not huge_pages.available()
    monkeypatch.setattr(huge_pages, "THP_MODE", tmp_path / "missing")
    assert huge_pages.thp_mode() is None


@needs_thp
def test_engine_tokens_are_the_same_with_and_without_huge_pages(tmp_path, monkeypatch):
    # wide enough that the projections pass the 1 MiB line in bf16 and in fp32
    folder = build_tiny_model(tmp_path / "wide", "llama", hidden_size=512, intermediate_size=1024)
    p = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = ["The quick brown fox", "Once upon a time"]
    runs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("INFERLAB_HUGE_PAGES", flag)
        eng = LLMEngine(EngineConfig(model=str(folder), num_kv_blocks=64))
        w = eng.model.layers[0].mlp.gate_up_proj.weight  # (2 * 1024, 512)
        moved = w.untyped_storage().nbytes() > w.nbytes  # a view into an arena
        plain = [o.token_ids for o in eng.generate(prompts, p)]
        sizes = [eng.weights_bytes]
        eng.set_quantization("int8")  # a runtime requantization: the new layers move too
        eng.step()  # the swap lands between steps
        q = eng.model.layers[0].mlp.gate_up_proj.qweight  # (2 * 1024, 512) int8: 1 MiB
        eight = [o.token_ids for o in eng.generate(prompts, p)]
        sizes.append(eng.weights_bytes)  # a tensor's own bytes, not its arena's (which keeps the originals)
        runs[flag] = (plain, eight, sizes, moved, q.untyped_storage().nbytes() > q.nbytes)
    assert runs["0"][:3] == runs["1"][:3]  # the same tokens and the same weight bytes either way
    assert runs["1"][2][1] < runs["1"][2][0]  # 8 bits take fewer bytes than 16
    assert runs["1"][3:] == (True, True) and runs["0"][3:] == (False, False)


@needs_thp
def test_zeros_are_zero_aligned_and_writable():
    t = huge_pages.zeros((4, 1 << 16, 8), torch.bfloat16, torch.device("cpu"))  # 4 MiB
    assert t.shape == (4, 1 << 16, 8) and t.dtype == torch.bfloat16 and not t.any()
    assert t.data_ptr() % huge_pages.huge_page_bytes() == 0
    t[1, 5] = 3.0
    assert t.sum().item() == 24.0
    small = huge_pages.zeros((3, 4), torch.float32, torch.device("cpu"))
    assert small.untyped_storage().nbytes() == small.nbytes  # small: torch's own allocation


def _resident_pages(t: torch.Tensor) -> tuple[int, int]:
    """(pages of t's memory in RAM now, pages it spans), from mincore(2)."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = os.sysconf("SC_PAGE_SIZE")
    start = t.data_ptr() // page * page
    n = -(-(t.data_ptr() + t.nbytes - start) // page)
    vec = (ctypes.c_ubyte * n)()
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(n * page), vec) == 0, ctypes.get_errno()
    return sum(b & 1 for b in vec), n


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore(2) as Linux has it")
def test_kv_cache_is_written_when_allocated_not_by_the_first_steps(tmp_path):
    """Every page of a new engine's KV cache is in memory before its first step: left to the steps that
    first write them, their page faults (compaction, on pages advised MADV_HUGEPAGE with THP's defrag at
    "madvise") stalled one step for 1.5 s."""
    folder = build_tiny_model(tmp_path / "wide", "llama", hidden_size=512, intermediate_size=1024)
    eng = LLMEngine(EngineConfig(model=str(folder), num_kv_blocks=512))
    for k, v in eng.runner.kv_caches:
        for t in (k, v):
            resident, total = _resident_pages(t)
            assert resident == total


def test_describe_says_why_not(tmp_path, monkeypatch):
    f = tmp_path / "enabled"
    f.write_text("always madvise [never]\n")
    monkeypatch.setattr(huge_pages, "THP_MODE", f)
    assert huge_pages.describe() == "off: transparent huge pages are never here"
    monkeypatch.setenv("INFERLAB_HUGE_PAGES", "0")
    assert huge_pages.describe().startswith("off (INFERLAB_HUGE_PAGES=0)")


@needs_thp
def test_engine_weights_are_filled_straight_into_one_arena_ties_and_values_kept(tmp_path, monkeypatch):
    """The target's large weights are copied once, into the arena (ArenaPlan), not into ordinary pages
    and then moved: the weights manager finds nothing left to move, and the values are the checkpoint's."""
    from safetensors.torch import load_file

    import engine.quant.manager as manager

    folder = build_tiny_model(tmp_path / "wide", "llama", hidden_size=512, intermediate_size=1024,
                              vocab_size=4096, tie_word_embeddings=True)
    moved: list[int] = []
    real = huge_pages.move_to_huge_pages
    monkeypatch.setattr(manager, "move_to_huge_pages", lambda m, *a: moved.append(real(m, *a)) or moved[-1])
    eng = LLMEngine(EngineConfig(model=str(folder), num_kv_blocks=64, dtype="bfloat16"))
    m = eng.model
    assert moved and set(moved) == {0} and eng.weights.on_huge_pages  # filled in place, said in the line
    gate_up, embed = m.layers[0].mlp.gate_up_proj.weight, m.embed_tokens.weight
    assert gate_up.untyped_storage().data_ptr() == embed.untyped_storage().data_ptr()  # one arena
    assert gate_up.untyped_storage().nbytes() > gate_up.nbytes
    # a projection under 1 MiB too (o_proj here: 512 KiB; SmolLM2-135M's: 648 KiB, which on 4 KiB pages a
    # decode step read at half its neighbours' speed)
    o_proj = m.layers[0].self_attn.o_proj.weight
    assert o_proj.nbytes < 1 << 20 and o_proj.untyped_storage().data_ptr() == embed.untyped_storage().data_ptr()
    assert m.lm_head.weight.data_ptr() == embed.data_ptr()  # still tied: one copy, no slot for the head
    ckpt = {k: v.to(torch.bfloat16) for k, v in load_file(str(next(folder.glob("*.safetensors")))).items()}
    inter = 1024
    assert torch.equal(gate_up[:inter], ckpt["model.layers.0.mlp.gate_proj.weight"])
    assert torch.equal(gate_up[inter:], ckpt["model.layers.0.mlp.up_proj.weight"])
    assert torch.equal(embed, ckpt["model.embed_tokens.weight"])
    norm = m.layers[0].input_layernorm.weight  # small: made where torch makes it
    assert norm.untyped_storage().nbytes() == norm.nbytes


def test_arena_plan_leaves_a_model_alone_where_huge_pages_are_off(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLAB_HUGE_PAGES", "0")
    folder = build_tiny_model(tmp_path / "wide", "llama", hidden_size=512, intermediate_size=1024)
    eng = LLMEngine(EngineConfig(model=str(folder), num_kv_blocks=64))
    w = eng.model.layers[0].mlp.gate_up_proj.weight
    assert w.untyped_storage().nbytes() == w.nbytes and not eng.weights.on_huge_pages
