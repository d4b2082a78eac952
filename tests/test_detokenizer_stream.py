"""The detokenizer through the tokenizers library's DecodeStream (issue 46, point 4: one call a token
instead of two window decodes) releases what the window path releases, push by push."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_tokenizer import build_sp_tokenizer  # tests/ is on sys.path (rootdir conftest)

from engine.core.detokenizer import IncrementalDetokenizer
from engine.loading.tokenizer import Tokenizer

TEXT = "Hello 🙂 world! 世界こんにちは 🚀 naïve café, ok.\nDone"


@pytest.fixture(scope="module")
def tokenizers(tiny_llama, tmp_path_factory) -> dict[str, Tokenizer]:
    return {"byte-level": Tokenizer.from_folder(tiny_llama),
            "sentencepiece": Tokenizer.from_folder(build_sp_tokenizer(tmp_path_factory.mktemp("sp")))}


def run(tok: Tokenizer, prompt, ids, stop, chunk, stream: bool):
    det = IncrementalDetokenizer(tok, list(prompt), list(stop))
    if not stream:
        det._step = None  # the window path
    deltas = [det.push(ids[i:i + chunk]) for i in range(0, len(ids), chunk)]
    return deltas, det.finish(), det.text, det.stopped


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), chunk=st.integers(1, 3), stop=st.sampled_from([(), ("world",), ("🚀", "ok")]),
       text_part=st.booleans())
def test_stream_releases_what_the_window_path_releases(tokenizers, data, chunk, stop, text_part):
    """Byte-level BPE (SmolLM2, Llama 3, Qwen): any ids, split characters and special tokens included."""
    tok = tokenizers["byte-level"]
    ids = data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=24))
    if text_part:  # and real text, whose characters span tokens
        ids = tok.encode(TEXT, add_special_tokens=False) + ids
    prompt = data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=8))
    if not tok.decode(prompt).endswith("\ufffd"):  # (a prompt cut inside a character decodes windows)
        assert IncrementalDetokenizer(tok, prompt, [])._step is not None  # the library's stream runs here
    assert run(tok, prompt, ids, stop, chunk, True) == run(tok, prompt, ids, stop, chunk, False)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), chunk=st.integers(1, 3))
def test_sentencepiece_byte_fallback_never_fails_a_request(tokenizers, data, chunk):
    """Any ids through a byte-fallback sentencepiece tokenizer: where the library's stream refuses a
    sequence (it raises on some runs of byte tokens) the detokenizer goes on with windows; it never raises."""
    tok = tokenizers["sentencepiece"]
    ids = data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=24))
    prompt = data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=8))
    deltas, tail, text, _ = run(tok, prompt, ids, (), chunk, True)
    assert "".join(deltas) + tail == text


@pytest.mark.parametrize("prompt", ["The prompt", "世界", ""])
def test_sentencepiece_stream_gives_the_generated_part_of_the_full_decode(tokenizers, prompt):
    """Characters of three byte tokens each (byte fallback), after a prompt that ends on a character:
    the window path shows replacement characters here (a 5-token window cut inside a character turns
    the whole run of byte tokens into U+FFFD); the stream does not."""
    tok = tokenizers["sentencepiece"]
    p = tok.encode(prompt) if prompt else []
    ids = tok.encode(TEXT, add_special_tokens=False)
    deltas, tail, text, _ = run(tok, p, ids, (), 1, True)
    assert "".join(deltas) + tail == text == tok.decode(p + ids)[len(tok.decode(p)):]
    assert "\ufffd" not in text


def test_stream_text_is_the_full_decode(tokenizers):
    tok = tokenizers["byte-level"]
    ids = tok.encode(TEXT, add_special_tokens=False)
    deltas, tail, text, _ = run(tok, [], ids, (), 1, True)
    assert all("\ufffd" not in d for d in deltas) and tail == ""
    assert "".join(deltas) == text == TEXT == tok.decode(ids)



def test_a_tokenizer_that_cleans_up_spaces_decodes_windows(tiny_llama):
    """The library's stream does not clean up spaces after decoding (transformers' clean_up_tokenization_spaces):
    such a tokenizer keeps the window path, as before this change."""
    tok = Tokenizer.from_folder(tiny_llama)
    assert IncrementalDetokenizer(tok, [], [])._step is not None
    tok._clean_up_spaces = True
    assert tok.decode_stream([], True) is None and IncrementalDetokenizer(tok, [], [])._step is None
