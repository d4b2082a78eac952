"""A step's RequestOutput.token_ids is a view of the request's list (engine/token_ids.py), not a copy made every
step: it reads as a tuple everywhere, never changes once handed out, and building an output never walks the
list (issue 46: a copy cost O(tokens so far) per request per step)."""
from __future__ import annotations

import copy
import json
import pickle

import pytest

from app.record.codec import Decoder, encode
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.core.output_processor import append_token, make_output
from engine.core.request import Request
from engine.events import RequestOutput
from engine.token_ids import AppendOnlyIds, TokenIds


def _view(ids: list[int], n: int | None = None) -> TokenIds:
    return TokenIds(AppendOnlyIds(ids), n)


def test_a_view_reads_as_the_tuple_it_stands_for():
    view = _view([3, 1, 4, 1, 5, 9], 5)  # a sixth token appended after the snapshot
    want = (3, 1, 4, 1, 5)
    assert len(view) == 5 and list(view) == list(want) and tuple(view) == want
    assert view == want and want == view and view == list(want) and list(want) == view
    assert view != want[:4] and want[:4] != view and view != (*want, 9) and view != "31415"
    assert view == _view([3, 1, 4, 1, 5]) and _view([3, 1, 4, 1, 5]) == view and view != _view([3, 1, 4, 1, 6])
    assert view[0] == 3 and view[-1] == 5 and view[-5] == 3
    with pytest.raises(IndexError):
        view[5]  # the token appended after the snapshot is not part of it
    with pytest.raises(IndexError):
        view[-6]
    for cut in (slice(1, 3), slice(None, None, -1), slice(-2, None), slice(None, 99), slice(4, 0, -2), slice(7, 9)):
        assert view[cut] == want[cut] and type(view[cut]) is tuple
    assert 5 in view and 9 not in view and view.count(1) == 2 and view.index(5) == 4
    assert tuple(reversed(view)) == want[::-1]
    assert hash(view) == hash(want) and {want: "x"}[view] == "x" and {view: "x"}[want] == "x"
    assert repr(view) == repr(want) and str(view) == str(want)
    assert view + (2,) == (*want, 2) and (0,) + view == (0, *want)
    with pytest.raises(TypeError):
        [0] + view  # as a tuple: no adding to a list  # noqa: RUF005
    assert bool(view) and not _view([])


def test_a_view_pickles_and_copies_as_a_plain_tuple():
    view = _view([7, 8, 9], 2)
    for back in (pickle.loads(pickle.dumps(view)), copy.copy(view), copy.deepcopy(view)):
        assert back == (7, 8) and type(back) is tuple


def test_a_view_longer_than_its_list_is_refused():
    with pytest.raises(ValueError):
        TokenIds([1, 2], 3)


def test_the_tokens_behind_the_views_only_grow():
    ids = AppendOnlyIds([1, 2, 3])
    ids.append(4)
    ids += [5]
    ids.extend([6])
    for change in (lambda: ids.__setitem__(0, 9), lambda: ids.__delitem__(-1), ids.pop, ids.clear,
                   lambda: ids.insert(0, 9), lambda: ids.remove(1), ids.sort, ids.reverse,
                   lambda: ids.__setitem__(slice(0, 2), []), lambda: ids.__imul__(0)):
        with pytest.raises(TypeError, match="only grow"):
            change()
    assert ids == [1, 2, 3, 4, 5, 6]
    assert Request("r", [1], SamplingParams()).output_token_ids.__class__ is AppendOnlyIds


def _stepped(n: int) -> tuple[Request, list[RequestOutput]]:
    """A request given n tokens through the engine's own per-token path, keeping each step's output."""
    req = Request("r", [1, 2], SamplingParams(max_tokens=10_000, ignore_eos=True))
    outs = []
    for tok in range(100, 100 + n):
        text = append_token(req, tok, frozenset(), 100_000)
        outs.append(make_output(req, [tok], text, None, str))
    return req, outs


def test_an_output_never_changes_after_it_is_handed_out():
    req, outs = _stepped(6)
    for k, out in enumerate(outs, start=1):
        assert len(out.token_ids) == k and out.token_ids == tuple(range(100, 100 + k))
        assert list(out.token_ids) == list(range(100, 100 + k)) and out.token_ids[-1] == 99 + k
    assert req.output_token_ids == list(range(100, 106))


class _Tripwire(AppendOnlyIds):
    """The request's tokens, failing any read of the whole list (a copy, a walk, a slice)."""

    __slots__ = ()

    def __iter__(self):
        raise AssertionError("the whole token list was walked")

    def __getitem__(self, index):
        raise AssertionError("the token list was read")

    def copy(self):
        raise AssertionError("the token list was copied")


def test_building_an_output_never_reads_the_tokens_so_far():
    """The per-step work does not grow with the output: make_output takes the list's length and nothing else
    of it (a tuple() copy walks all of it and trips the wire)."""
    req = Request("r", [1, 2], SamplingParams(max_tokens=100_000, ignore_eos=True))
    req.output_token_ids = _Tripwire(range(5_000))
    req.first_token_time = req.last_token_time = 1.0
    out = make_output(req, [4_999], "", None, str)
    assert len(out.token_ids) == 5_000
    req.output_token_ids.append(5_000)  # the engine goes on appending: the output handed out stays at 5,000
    assert len(out.token_ids) == 5_000 and len(req.output_token_ids) == 5_001


@pytest.mark.parametrize("spec", [{}, {"spec_method": "ngram", "num_speculative_tokens": 3}])
def test_every_streamed_output_is_the_prefix_the_request_had_at_its_step(tiny_llama, spec):
    """Through the engine (one token a step, and several a step under speculative decoding): each output's
    token_ids is what had been generated by its step, and the final one is the whole answer."""
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4, **spec))
    rid = eng.add_request([5, 6, 7, 5, 6, 7, 5, 6], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    seen: list[tuple[RequestOutput, tuple[int, ...], int]] = []
    while eng.has_unfinished():
        for out in eng.step():
            if out.request_id == rid:
                seen.append((out, tuple(out.token_ids), len(out.new_token_ids)))
    final = seen[-1][0].token_ids
    assert len(final) == 24 and seen[-1][0].finished
    grown = 0
    for out, at_step, n_new in seen:
        grown += n_new
        assert out.token_ids == at_step == tuple(final[:grown]) and len(out.token_ids) == grown


def test_recordings_rebuild_the_running_tokens_as_views_and_never_write_them():
    req, outs = _stepped(4)
    lines = [json.dumps(encode(out)) for out in outs]
    assert all("token_ids" not in json.loads(line) for line in lines)  # deltas only: new_token_ids
    decoder = Decoder()
    back = [decoder.item("RequestOutput", json.loads(line)) for line in lines]
    for k, (got, sent) in enumerate(zip(back, outs), start=1):
        assert isinstance(got, RequestOutput)
        assert got.token_ids == sent.token_ids == tuple(range(100, 100 + k)) and len(got.token_ids) == k
    assert json.dumps(list(back[-1].token_ids)) == "[100, 101, 102, 103]"  # how app/generate.py writes them
    with pytest.raises(TypeError):
        json.dumps(back[-1].token_ids)  # json takes only real lists and tuples: consumers write list(...)



def test_a_filled_block_is_hashed_from_its_own_tokens_only(tiny_llama, monkeypatch):
    """The prefix cache hashes each block as it fills: the engine hands it Request.tokens, which reads that
    block's slice in place, not prompt + output copied every time (all_token_ids: O(tokens so far))."""
    from engine.core.block_manager import BlockManager

    req = Request("r", list(range(10)), SamplingParams(max_tokens=10_000, ignore_eos=True))
    req.output_token_ids = AppendOnlyIds(range(10, 5_000))
    tokens = req.tokens
    assert len(tokens) == 5_000 and tokens[3] == 3 and tokens[-1] == 4_999 and tokens[12] == 12
    assert tokens[8:13] == [8, 9, 10, 11, 12] and tokens[::1000] == [0, 1000, 2000, 3000, 4000]
    with pytest.raises(IndexError):
        tokens[5_000]
    bm, other = BlockManager(400, 16), BlockManager(400, 16)
    for b in (bm, other):
        b.allocate("r", [], 5_000)
    bm.commit("r", req.tokens, 5_000)
    other.commit("r", list(range(5_000)), 5_000)  # the same blocks hashed from a plain list
    assert bm._last_hash["r"] == other._last_hash["r"]
    # an engine's decode steps never copy a request's whole token list (admission may, once)
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4))
    copies = []
    real = Request.all_token_ids
    monkeypatch.setattr(Request, "all_token_ids", property(lambda r: copies.append(r.num_tokens) or real.fget(r)))
    eng.add_request([5, 17, 42, 99, 7], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
    assert len(copies) <= 1  # 40 tokens fill 10 blocks: each was hashed from its own slice


def test_the_steps_constructor_makes_the_dataclasss_own_output():
    """engine.events.new_request_output (the step's faster constructor, each slot written through its descriptor)
    makes the instance RequestOutput(...) makes: equal, same hash, as frozen; every field must be given."""
    import dataclasses

    from engine.events import new_request_output
    values = {f.name: f"v{i}" if f.type == "str" else i for i, f in enumerate(dataclasses.fields(RequestOutput))}
    values.update(new_token_ids=(5,), token_ids=(1, 5), sources=(), new_token_pieces=(), logprobs=None)
    fast, slow = new_request_output(**values), RequestOutput(**values)
    assert type(fast) is RequestOutput and fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert dataclasses.asdict(fast) == dataclasses.asdict(slow) and pickle.loads(pickle.dumps(fast)) == slow
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.text = "changed"  # type: ignore[misc]
    with pytest.raises(TypeError):
        new_request_output(**{k: v for k, v in values.items() if k != "lora_name"})


def test_make_output_puts_each_field_in_its_place():
    """make_output passes every field by position (the fast constructor): the output equals the one the dataclass
    builds from the same request by field name, for one token, several (with their pieces and sources) and none."""
    from engine.events import TokenSource

    req = Request("r", [1, 2, 3], SamplingParams(max_tokens=10_000, ignore_eos=True), arrival_time=0.5,
                  lora_name="adapter")
    req.error = "why"
    for tok in (100, 101, 102):
        append_token(req, tok, frozenset(), 100_000, now=1.0 + tok / 100)
    for new, sources in (([102], None), ([101, 102], [TokenSource.ACCEPTED, TokenSource.BONUS]), ([], None)):
        got = make_output(req, new, "tx", None, lambda t: f"<{t}>", sources)
        want = RequestOutput(
            request_id="r", new_token_ids=tuple(new), new_text="tx", token_ids=(100, 101, 102), text="",
            finished=False, finish_reason=None,
            sources=tuple(sources) if sources else (TokenSource.DECODED,) * len(new), logprobs=None,
            num_prompt_tokens=3, error="why", held_back_chars=0,
            new_token_pieces=tuple(f"<{t}>" for t in new) if len(new) > 1 else (),
            ttft_s=req.first_token_time - 0.5, tokens_per_s=2 / (req.last_token_time - req.first_token_time),
            lora_name="adapter")
        assert got == want
