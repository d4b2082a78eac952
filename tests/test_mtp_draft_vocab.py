"""MTP heads draft from their own vocabulary (MtpHeads.draft_vocab): the tokens their training softmax
covered, ranked without reading the rest of the lm_head; saved with the heads, kept by training."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.spec.mtp import MtpHeads, MtpProposer, load_heads, save_heads
from engine.spec.mtp_train import train_heads
from tests.conftest import built_kernel, kernel_tiers

HIDDEN, VOCAB = 16, 50


class CountingLinear(nn.Linear):
    calls = 0

    def forward(self, x):
        CountingLinear.calls += 1
        return super().forward(x)


class TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.lm_head = CountingLinear(HIDDEN, VOCAB, bias=False)


def random_heads(num: int = 2) -> MtpHeads:
    torch.manual_seed(1)
    heads = MtpHeads(HIDDEN, num)
    for b in heads.blocks:
        nn.init.normal_(b.weight, std=0.5)
    return heads


def test_the_draft_vocabulary_is_saved_with_the_heads(tmp_path):
    heads = random_heads()
    heads.draft_vocab = torch.tensor([3, 7, 11, 40])
    save_heads(heads, tmp_path / "h.safetensors", {"model": "tiny"})
    loaded, _ = load_heads(tmp_path / "h.safetensors", HIDDEN)
    assert loaded.draft_vocab.tolist() == [3, 7, 11, 40]
    heads.draft_vocab = None  # heads without one (every earlier file) load as before
    save_heads(heads, tmp_path / "plain.safetensors", {})
    assert load_heads(tmp_path / "plain.safetensors", HIDDEN)[0].draft_vocab is None


@pytest.mark.parametrize("vocab, why", [([3, 7, VOCAB + 2, 40], "outside this model's 50 tokens"),
                                        ([3, -7, 11, 40], "outside"), ([[3, 7], [11, 40]], "not a list"),
                                        ([3, 7], "at least 3")])
def test_a_heads_file_that_lies_fails_at_load_naming_it(tmp_path, vocab, why):
    """Draft ids out of the model's range (or too few for the tree's widest level, or not ids) failed only
    at the first proposal, inside a step; now the engine is not built, with one line naming the file."""
    heads = random_heads()
    heads.draft_vocab = torch.tensor(vocab)
    path = tmp_path / "h.safetensors"
    save_heads(heads, path, {})
    with pytest.raises(ValueError, match=why) as err:
        load_heads(path, HIDDEN, VOCAB, min_draft_vocab=3)
    assert str(path) in str(err.value) and "train-mtp" in str(err.value)


def test_heads_with_junk_metadata_weights_or_bytes_fail_at_load(tmp_path):
    from safetensors.torch import load_file, save_file

    path = tmp_path / "h.safetensors"
    save_heads(random_heads(), path, {})
    state = load_file(str(path))
    for metadata, change, why in (("{not json", None, "not MTP heads"), ("[1, 2]", None, "not a JSON object"),
                                  ("{}", "nan", "not finite"), ("{}", "extra", "not readable")):
        bad = dict(state)
        if change == "nan":
            bad = {k: torch.full_like(v, float("nan")) for k, v in state.items()}
        elif change == "extra":
            bad["blocks.9.weight"] = torch.zeros(3)
        save_file(bad, str(path), metadata={"inferlab_mtp": metadata})
        with pytest.raises(ValueError, match=why):
            load_heads(path, HIDDEN, VOCAB)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match="not readable MTP heads"):
        load_heads(path, HIDDEN, VOCAB)


def test_proposals_rank_only_the_draft_vocabulary_without_the_whole_lm_head():
    model, heads = TinyModel(), random_heads()
    vocab = torch.arange(0, VOCAB, 3)  # every third token
    heads.draft_vocab = vocab
    hidden, last = torch.randn(3, HIDDEN), [4, 9, 20]
    with torch.no_grad():  # the reference: the whole lm_head's scores, tokens outside the vocabulary ruled out
        scores = model.lm_head(heads(hidden, model.embed_tokens(torch.tensor(last)), 2))
        allowed = torch.full((VOCAB,), float("-inf"))
        allowed[vocab] = 0.0
        want = (scores + allowed).argmax(-1).tolist()  # (3, 2): each request's chain
    CountingLinear.calls = 0
    got = MtpProposer(heads, model, (1, 1)).propose_batch(hidden, [2, 2, 2], last_tokens=last, chain=True)
    assert CountingLinear.calls == 0  # the vocabulary's rows only, never the whole lm_head
    assert [tokens for tokens, _ in got] == want
    assert all(t % 3 == 0 for tokens, _ in got for t in tokens)


def test_proposals_follow_a_swapped_lm_head():
    model, heads = TinyModel(), random_heads(1)
    heads.draft_vocab = torch.arange(VOCAB)
    prop = MtpProposer(heads, model, (1,))
    hidden = torch.randn(2, HIDDEN)
    before = prop.propose_batch(hidden, [1, 1], last_tokens=[1, 2], chain=True)
    model.lm_head = CountingLinear(HIDDEN, VOCAB, bias=False)  # requantizing swaps the module
    with torch.no_grad():
        model.lm_head.weight.copy_(-TinyModel().lm_head.weight)
    after = prop.propose_batch(hidden, [1, 1], last_tokens=[1, 2], chain=True)
    assert before != after


def test_training_keeps_the_vocabulary_its_softmax_covered():
    torch.manual_seed(2)
    n = 64
    h, nxt = torch.randn(n, HIDDEN), torch.randint(0, 10, (n,))
    labels = torch.randint(10, 20, (n, 2))
    weights = (torch.randn(VOCAB, HIDDEN), torch.randn(VOCAB, HIDDEN))
    heads = train_heads(h, nxt, labels, weights, 2, epochs=1, batch=32)
    assert heads.draft_vocab.tolist() == torch.cat([nxt, labels.flatten()]).unique().tolist()
    assert train_heads(h, nxt, labels, weights, 2, epochs=1, batch=32, full_vocab=True).draft_vocab is None


def test_chains_carry_the_chance_of_each_position_being_accepted():
    """propose_chains: the top-1 chain of propose_batch, and per position the product of the heads' top-1
    probabilities so far (over the draft vocabulary, the softmax the heads were trained with)."""
    model, heads = TinyModel(), random_heads(3)
    heads.draft_vocab = torch.arange(0, VOCAB, 2)
    prop = MtpProposer(heads, model, (1, 1, 1))
    hidden, last = torch.randn(2, HIDDEN), [4, 9]
    chains = prop.propose_chains(hidden, [3, 2], last_tokens=last)
    batch = prop.propose_batch(hidden, [3, 2], last_tokens=last, chain=True)
    assert [tokens for tokens, _ in chains] == [tokens for tokens, _ in batch]
    with torch.no_grad():
        probs = (heads(hidden, model.embed_tokens(torch.tensor(last)), 3) @ model.lm_head.weight[heads.draft_vocab].t())
        top = probs.softmax(-1).max(-1).values.cumprod(-1)  # (2, 3)
    assert chains[0][1] == pytest.approx(top[0].tolist(), rel=1e-5)
    assert chains[1][1] == pytest.approx(top[1, :2].tolist(), rel=1e-5)
    assert all(a >= b for _, c in chains for a, b in zip(c, c[1:]))  # a chain's chances never rise


class CountingStream:
    """The native module, counting the products it is asked for."""

    def __init__(self, module) -> None:
        self.module, self.calls = module, 0

    def stream_linear_bf16(self, x, w, b):
        self.calls += 1
        return self.module.stream_linear_bf16(x, w, b)


@pytest.mark.parametrize("sequential", [False, True])
@pytest.mark.parametrize("tier", kernel_tiers())
def test_with_the_native_kernel_a_proposal_streams_bf16_weights_and_drafts_as_float32_does(tier, sequential):
    """bf16 rows on the CPU with the engine's kernels attached to the lm_head: every head in one streamed
    product and the draft vocabulary in another (not one float32 product per head; sequential heads: two
    a head, each reading the draft before it); the scores are the float32 path's within bf16 rounding, so
    every draft whose lead is clear is the same token."""
    from engine.kernels import stream_linear_kernel

    hidden_size, vocab_size = 64, 300
    torch.manual_seed(2)
    model = nn.Module()
    model.embed_tokens = nn.Embedding(vocab_size, hidden_size).to(torch.bfloat16)
    model.lm_head = nn.Linear(hidden_size, vocab_size, bias=False).to(torch.bfloat16)
    heads = MtpHeads(hidden_size, 3, sequential=sequential)
    for b in heads.blocks:
        nn.init.normal_(b.weight, std=0.1)
        nn.init.normal_(b.bias, std=0.1)
    heads.draft_vocab = torch.arange(0, vocab_size, 2)
    prop = MtpProposer(heads, model, (1, 1, 1))
    hidden, last = torch.randn(3, hidden_size).to(torch.bfloat16), [4, 9, 200]
    with torch.inference_mode():
        exact, ids = prop._logits(hidden, 3, last)  # no kernel attached: the float32 products
        model.lm_head.stream = stream = CountingStream(built_kernel(stream_linear_kernel, tier))
        got, got_ids = prop._logits(hidden, 3, last)
    # independent: the heads (3 rows), the vocabulary (9 rows: 8, then 1); sequential: two a head, 3 rows each
    assert stream.calls == (6 if sequential else 3)
    assert got.shape == exact.shape == (3, 3, len(heads.draft_vocab)) and torch.equal(got_ids, ids)
    tol = 2**-6 * exact.abs().max().item()
    assert (got.float() - exact).abs().max().item() <= tol
    top2 = exact.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * tol
    assert clear.any() and torch.equal(got.argmax(-1)[clear], exact.argmax(-1)[clear])
    chains = prop.propose_chains(hidden, [3, 2, 1], last)
    assert [len(tokens) for tokens, _ in chains] == [3, 2, 1] and stream.calls == (12 if sequential else 6)
