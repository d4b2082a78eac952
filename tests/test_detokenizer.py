"""IncrementalDetokenizer: streamed text equals the full decode, never shows a half character, and
never shows a stop string."""
from __future__ import annotations

import pytest
from test_tokenizer import build_sp_tokenizer  # tests/ is on sys.path (rootdir conftest)

from engine.core.detokenizer import PREFIX_WINDOW, IncrementalDetokenizer
from engine.loading.tokenizer import Tokenizer

MIXED = "Hello 🙂 world! 世界こんにちは 🚀🚀 naïve café, ok.\nDone"


@pytest.fixture(scope="module")
def tok(tiny_llama) -> Tokenizer:
    return Tokenizer.from_folder(tiny_llama)


@pytest.fixture(scope="module")
def sp_tok(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_folder(build_sp_tokenizer(tmp_path_factory.mktemp("sp")))


def stream(tokenizer, ids, prompt=(), stop=(), chunk=1):
    det = IncrementalDetokenizer(tokenizer, list(prompt), list(stop))
    deltas = [det.push(ids[i:i + chunk]) for i in range(0, len(ids), chunk)]
    return det, deltas


@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_multibyte_characters_never_show_replacement_char(tok, chunk):
    ids = tok.encode(MIXED, add_special_tokens=False)
    # the text really does split characters across byte-level tokens
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    det, deltas = stream(tok, ids, prompt=tok.encode("Prompt: "), chunk=chunk)
    assert all("\ufffd" not in d for d in deltas)
    assert det.finish() == ""
    assert "".join(deltas) == det.text == MIXED == tok.decode(ids)


def test_half_a_character_is_held_then_released(tok):
    ids = tok.encode("🚀", add_special_tokens=False)
    assert len(ids) > 1
    det = IncrementalDetokenizer(tok, [], [])
    assert det.push(ids[:-1]) == ""
    assert det.held_back_tokens == len(ids) - 1
    assert det.push(ids[-1:]) == "🚀"
    assert det.held_back_tokens == 0


def test_sentencepiece_keeps_spaces_between_pushes(sp_tok):
    text = "Hello world, the quick brown fox 世界 jumps."
    prompt = sp_tok.encode("The prompt")
    ids = sp_tok.encode(text, add_special_tokens=False)
    det, deltas = stream(sp_tok, ids, prompt=prompt)
    assert all("\ufffd" not in d for d in deltas)
    det.finish()
    # what a client sees is the generated part of decode(prompt + output)
    assert det.text == sp_tok.decode(prompt + ids)[len(sp_tok.decode(prompt)):]
    assert det.text == " " + text


@pytest.mark.parametrize("chunk", [1, 4])
def test_stop_string_is_never_emitted(tok, chunk):
    text = "The answer is 42. STOP and then more text"
    ids = tok.encode(text, add_special_tokens=False)
    det, deltas = stream(tok, ids, stop=["STOP"], chunk=chunk)
    assert det.stopped
    assert "".join(deltas) == det.text == "The answer is 42. "
    assert det.push(tok.encode(" extra", add_special_tokens=False)) == ""
    assert det.finish() == ""


def test_stop_string_straddling_tokens(tok):
    pieces = ["Hello wor", "ld<", "EN", "D> tail"]
    ids = [tok.encode(p, add_special_tokens=False) for p in pieces]
    det = IncrementalDetokenizer(tok, [], ["<END>"])
    assert det.push(ids[0]) == "Hello wor"
    assert det.push(ids[1]) == "ld"  # "<" might start the stop string: held
    assert det.held_back_chars == 1
    assert det.push(ids[2]) == ""  # "<EN" still might
    assert det.held_back_chars == 3
    assert det.push(ids[3]) == "" and det.stopped
    assert det.text == "Hello world"


def test_partial_stop_match_released_when_it_cannot_match(tok):
    det = IncrementalDetokenizer(tok, [], ["STOP", "\n\n"])
    assert det.push(tok.encode("go ST", add_special_tokens=False)) == "go "
    assert det.held_back_chars == 2
    assert det.push(tok.encode("ART\n", add_special_tokens=False)) == "START"
    assert det.held_back_chars == 1  # a single newline may begin "\n\n"
    assert det.push(tok.encode("x", add_special_tokens=False)) == "\nx"
    assert not det.stopped


def test_finish_flushes_a_held_partial_stop(tok):
    det = IncrementalDetokenizer(tok, [], ["STOP"])
    assert det.push(tok.encode("end ST", add_special_tokens=False)) == "end "
    assert det.finish() == "ST"
    assert det.text == "end ST" and not det.stopped and det.held_back_chars == 0


def test_earliest_stop_wins_and_multibyte_stop(tok):
    det = IncrementalDetokenizer(tok, [], ["world", "🙂"])
    ids = tok.encode("hi 🙂 world", add_special_tokens=False)
    out = "".join(det.push([i]) for i in ids)
    assert det.stopped and out == det.text == "hi "


def test_special_tokens_are_skipped(tok):
    ids = tok.encode("Hi<|im_end|>", add_special_tokens=False)
    det, deltas = stream(tok, ids)
    det.finish()
    assert det.text == "Hi"


def test_work_per_push_is_bounded(tok):
    ids = tok.encode("The quick brown fox jumps over the lazy dog. " * 40, add_special_tokens=False)
    det = IncrementalDetokenizer(tok, tok.encode("a long prompt " * 50), ["never-there"])
    for i in ids:
        det.push([i])
        # only a window of context tokens is kept and decoded, however long the text gets
        assert len(det._ids) <= PREFIX_WINDOW + 1
        assert det.held_back_chars < len("never-there")
    det.finish()
    assert det.text == tok.decode(ids)
