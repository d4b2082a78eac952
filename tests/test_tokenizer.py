"""engine.loading.tokenizer.Tokenizer agrees with transformers.AutoTokenizer on the same folder."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.loading.tokenizer import Tokenizer

TEXTS = [
    "Hello world",
    "The quick brown fox, 12345 times!",
    "  leading and trailing spaces  ",
    "line one\nline two\n\n\ttabbed",
    "emoji 🙂🚀 and CJK 世界こんにちは, naïve café",
    "<|im_start|>user\nhi<|im_end|>\n",
]
SP_TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Hello world, hello there. Paged attention stores keys and values in blocks. ",
    "Continuous batching schedules every step; prefill reads the prompt and decode writes one token. ",
]


def build_sp_tokenizer(folder: Path, *, add_bos: bool = True) -> Path:
    """A Llama-2-style tokenizer: sentencepiece BPE over "▁"-words with byte fallback for
    everything outside its (English-only) vocabulary, BOS added, "▁" stripped at the start."""
    from tokenizers import AddedToken, decoders, models, normalizers, processors, trainers
    from tokenizers import Tokenizer as Fast

    normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    base = Fast(models.BPE(unk_token="<unk>"))
    base.normalizer = normalizer
    base.train_from_iterator(SP_TRAIN_TEXT, trainers.BpeTrainer(vocab_size=200, show_progress=False))
    trained = json.loads(base.to_str())["model"]
    specials = ["<unk>", "<s>", "</s>"]
    pieces = specials + [f"<0x{b:02X}>" for b in range(256)] + [t for t in trained["vocab"] if t not in specials]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    tok = Fast(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=merges, unk_token="<unk>",
                          byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizer
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "add_bos_token": add_bos, "add_eos_token": False}))
    return folder


def _hf(folder: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def sp_folder(tmp_path_factory) -> Path:
    return build_sp_tokenizer(tmp_path_factory.mktemp("sp-tok"))


@pytest.mark.parametrize("kind", ["byte_level", "sentencepiece"])
def test_encode_decode_match_transformers(kind, tiny_llama, sp_folder):
    folder = tiny_llama if kind == "byte_level" else sp_folder
    ours, ref = Tokenizer.from_folder(folder), _hf(folder)
    for text in TEXTS:
        for add_special in (True, False):
            ids = ours.encode(text, add_special_tokens=add_special)
            assert ids == ref.encode(text, add_special_tokens=add_special), (text, add_special)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)
    assert ours.vocab_size == len(ref)
    assert ours.eos_token_id == ref.eos_token_id
    assert set(ref.all_special_ids) <= set(ours.all_special_ids)


def test_bos_comes_from_the_post_processor(sp_folder, tmp_path):
    tok = Tokenizer.from_folder(sp_folder)
    assert tok.encode("Hello world")[0] == tok.bos_token_id == 1
    assert tok.encode("Hello world", add_special_tokens=False) == tok.encode("Hello world")[1:]
    # transformers 5 ignores add_bos_token when tokenizer.json exists; so do we
    folder = build_sp_tokenizer(tmp_path / "flag-off", add_bos=False)
    assert Tokenizer.from_folder(folder).encode("Hello") == _hf(folder).encode("Hello") == tok.encode("Hello")


def test_byte_level_has_no_bos(tiny_llama):
    tok = Tokenizer.from_folder(tiny_llama)
    assert tok.bos_token_id is None
    assert tok.encode("Hello") == tok.encode("Hello", add_special_tokens=False)
    assert tok.eos_token_id == tok.encode("<|im_end|>", add_special_tokens=False)[0]


def test_chat_template_matches_transformers(tiny_llama):
    ours, ref = Tokenizer.from_folder(tiny_llama), _hf(tiny_llama)
    chats = [
        [{"role": "user", "content": "Hello!"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 🙂"},
         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}],
    ]
    assert ours.has_chat_template
    for chat in chats:
        for gen in (True, False):
            expected = ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
            assert ours.apply_chat_template(chat, add_generation_prompt=gen) == expected


def test_chat_template_jinja_file_variables_and_raise_exception(tmp_path, tiny_llama):
    folder = tmp_path / "tok"
    shutil.copytree(tiny_llama, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["bos_token"] = {"__type": "AddedToken", "content": "<|endoftext|>", "lstrip": False,  # older form
                           "normalized": False, "rstrip": False, "single_word": False, "special": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").write_text(  # the .jinja file wins over the config entry
        "{{ bos_token }}{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
        "{{ raise_exception('bad role ' + m['role']) }}{% endif %}"
        "[{{ m['role'] }}]{{ m['content'] | tojson }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}")
    ours, ref = Tokenizer.from_folder(folder), _hf(folder)
    chat = [{"role": "user", "content": "café \"quoted\""}]
    rendered = ours.apply_chat_template(chat)
    assert rendered == '<|endoftext|>[user]"café \\"quoted\\""<|im_end|>[assistant]'
    assert rendered == ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    with pytest.raises(ValueError, match="the chat template failed: bad role tool"):  # a bad request
        ours.apply_chat_template([{"role": "tool", "content": "x"}])


def test_no_chat_template(sp_folder):
    tok = Tokenizer.from_folder(sp_folder)
    assert not tok.has_chat_template
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_id_to_piece_is_readable(tiny_llama, sp_folder):
    bl = Tokenizer.from_folder(tiny_llama)
    word = bl.encode(" the", add_special_tokens=False)
    assert len(word) == 1 and bl.id_to_piece(word[0]) == " the"
    emoji = bl.encode("🚀", add_special_tokens=False)  # not in the training text: split into byte pieces
    assert len(emoji) > 1
    assert "".join(bl.id_to_piece(i) for i in emoji) == "<0xF0><0x9F><0x9A><0x80>"
    assert bl.id_to_piece(bl.eos_token_id) == "<|im_end|>"

    sp = Tokenizer.from_folder(sp_folder)
    assert sp.id_to_piece(sp.encode("世", add_special_tokens=False)[-1]) == "<0x96>"
    assert "\ufffd" not in "".join(sp.id_to_piece(i) for i in range(sp.vocab_size))


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_folder(tmp_path)
