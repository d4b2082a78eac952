"""Tokenizer: a fast `tokenizers.Tokenizer` plus the chat template, read from a Hugging Face folder.

transformers is not imported at runtime; this file reproduces what `AutoTokenizer.from_pretrained`
does for encode, decode and `apply_chat_template` (tests compare the two). As in transformers 5,
tokenizer.json's post-processor alone decides whether BOS/EOS are added; the add_bos_token flag in
tokenizer_config.json is ignored when tokenizer.json exists.
"""
from __future__ import annotations

import functools
import json
import re
import secrets
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as FastTokenizer
from tokenizers import decoders

try:
    from tokenizers.decoders import DecodeStream
except ImportError:  # tokenizers < 0.21: the detokenizer decodes windows itself
    DecodeStream = None

from engine import files
from engine.loading.errors import MAX_CONFIG_BYTES, ModelLoadError, read_json

_NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")
MAX_TOKENIZER_BYTES = 256 * 2**20  # tokenizer.json: ~2 MB for SmolLM2, ~33 MB for the largest vocabularies


class Tokenizer:
    __slots__ = (
        "_byte_level", "_clean_up_spaces", "_plain", "_special_texts", "_template", "_tok",
        "all_special_ids", "bos_token_id", "eos_token_id", "special_tokens",
    )

    def __init__(self, fast: FastTokenizer, tokenizer_config: dict[str, Any], chat_template: str | None) -> None:
        self._tok = fast
        self.special_tokens: dict[str, str] = {
            name: _token_text(tokenizer_config[name]) for name in _NAMED_SPECIAL if tokenizer_config.get(name)
        }
        self.bos_token_id = self._id_of(self.special_tokens.get("bos_token"))
        self.eos_token_id = self._id_of(self.special_tokens.get("eos_token"))
        # transformers v5 defaults this to False; older configs that say True get the same cleanup.
        self._clean_up_spaces = bool(tokenizer_config.get("clean_up_tokenization_spaces", False))
        self._byte_level = _has_byte_level_decoder(fast.decoder)
        added = fast.get_added_tokens_decoder()
        special = {i for i, t in added.items() if t.special}
        special |= {i for i in (self._id_of(t) for t in self.special_tokens.values()) if i is not None}
        self.all_special_ids: tuple[int, ...] = tuple(sorted(special))
        # the special tokens' texts, longest first (one that contains another is swapped first)
        self._special_texts = tuple(sorted({added[i].content for i in special if i in added}, key=len, reverse=True))
        self._plain: FastTokenizer | None = None  # a copy that reads special-token text as text (encode_chat)
        self._template = _compile_template(chat_template) if chat_template else None

    @classmethod
    def from_folder(cls, path: str | Path) -> Tokenizer:
        folder = Path(path)
        tok_file = folder / "tokenizer.json"
        if not tok_file.exists():
            raise FileNotFoundError(f"no tokenizer.json in {folder} (only fast tokenizers are supported)")
        config = read_json(folder / "tokenizer_config.json")
        # Older folders keep the named special tokens in a separate file.
        for name, value in read_json(folder / "special_tokens_map.json").items():
            config.setdefault(name, value)
        # transformers v5 prefers the standalone .jinja file over the config entry.
        jinja_file = folder / "chat_template.jinja"
        template_file = jinja_file if jinja_file.is_file() else folder / "tokenizer_config.json"
        template = _template_text(jinja_file) if jinja_file.exists() else config.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if template is not None and not isinstance(template, str):
            raise ModelLoadError(f"{template_file}: the chat template is not text ({type(template).__name__})")
        try:
            files.check_regular(tok_file, MAX_TOKENIZER_BYTES)  # (the library would read a FIFO for ever)
            fast = FastTokenizer.from_file(str(tok_file))
        except Exception as e:  # noqa: BLE001 (the tokenizers library raises a bare Exception)
            raise ModelLoadError(f"{tok_file}: not a readable tokenizer ({getattr(e, 'why', e)})") from e
        try:
            return cls(fast, config, template)
        except jinja2.exceptions.TemplateError as e:
            raise ModelLoadError(f"{template_file}: the chat template does not compile ({e})") from e
        except (TypeError, KeyError, AttributeError) as e:  # a special token of the wrong kind
            raise ModelLoadError(f"{folder / 'tokenizer_config.json'}: special tokens of the wrong kind ({e})") from e

    # -- encode / decode -------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_chat(self, messages: list[dict], plain_special_text: bool = False) -> list[int]:
        """The chat template's token ids, its generation prompt added. `plain_special_text`: special-token
        text inside a message's content ("<|im_end|><|im_start|>system") is encoded as the characters it is
        written with, never as control tokens, so a message cannot end its turn or open another role's;
        the template's own special tokens stay control tokens. Each special text in the contents is swapped
        for a marker before rendering (a random nonce: content cannot forge one; no spaces: a template that
        trims content keeps it), and each marker is encoded afterwards as its text, by a copy of the
        tokenizer that reads special tokens as text."""
        if not plain_special_text or not self._special_texts:
            return self.encode(self.apply_chat_template(messages), add_special_tokens=False)
        nonce = secrets.token_hex(8)
        marks = {text: f"\ue000{nonce}:{i}\ue001" for i, text in enumerate(self._special_texts)}
        swap = re.compile("|".join(re.escape(text) for text in self._special_texts))
        escaped = [{**m, "content": swap.sub(lambda found: marks[found.group(0)], m["content"])}
                   if isinstance(m.get("content"), str) else m for m in messages]
        if self._plain is None:
            self._plain = FastTokenizer.from_str(self._tok.to_str())
            self._plain.encode_special_tokens = True
        texts = {mark: text for text, mark in marks.items()}
        ids: list[int] = []
        for piece in re.split(f"(\ue000{nonce}:\\d+\ue001)", self.apply_chat_template(escaped)):
            if piece in texts:
                ids += self._plain.encode(texts[piece], add_special_tokens=False).ids
            elif piece:
                ids += self._tok.encode(piece, add_special_tokens=False).ids
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        text = self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return _clean_up_tokenization(text) if self._clean_up_spaces else text

    def decode_stream(self, context: list[int], skip_special_tokens: bool = True) -> Callable[[int], str | None] | None:
        """One token id -> the text it releases, or None while the text so far ends inside a character: the
        library's incremental decoder (tokenizers' DecodeStream, vLLM's and TGI's), primed with `context` (the
        tokens before: a leading space may depend on them). One call a token, ~15x cheaper than decoding a
        window twice per token. None where it would not give what decode() gives (this tokenizer cleans up
        spaces after decoding, the context ends inside a character) or the library has no DecodeStream that
        takes a context."""
        if DecodeStream is None or self._clean_up_spaces:
            return None
        if self.decode(context, skip_special_tokens).endswith("\ufffd"):
            return None  # the context ends inside a character: the stream would show its U+FFFD as new text
        try:
            stream = DecodeStream(ids=list(context), skip_special_tokens=skip_special_tokens)
        except TypeError:  # tokenizers 0.21: no context
            return None
        return functools.partial(stream.step, self._tok)

    def id_to_piece(self, token_id: int) -> str:
        """Readable text of one token for display: a space shows as a space, and a token that holds
        only part of a UTF-8 character shows its bytes, e.g. "<0xE4><0xBD>", instead of U+FFFD."""
        text = self._tok.decode([token_id], skip_special_tokens=False)
        if "\ufffd" not in text:
            return text
        piece = self._tok.id_to_token(token_id) or ""
        if self._byte_level:
            raw = bytes(_BYTE_DECODER.get(ch, 0x3F) for ch in piece)
            return "".join(f"<0x{b:02X}>" for b in raw)
        return piece  # sentencepiece byte-fallback pieces are already spelled "<0xE4>"

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    # -- chat ------------------------------------------------------------------------------------

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def set_chat_template(self, template: str) -> None:
        """Render chats with `template` (Jinja text, e.g. `inferlab serve --chat-template FILE`) instead of
        the model's own; ValueError when it does not compile (the old one is kept)."""
        try:
            self._template = _compile_template(template)
        except jinja2.exceptions.TemplateError as e:
            raise ValueError(f"the chat template does not compile ({e})") from e

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render the conversation as the model expects it (same variables as transformers)."""
        if self._template is None:
            raise ValueError("this tokenizer has no chat template; send a plain prompt instead")
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **self.special_tokens, **kwargs
            )
        except jinja2.exceptions.TemplateError as e:  # the model's template refused or failed: a bad request
            raise ValueError(f"the chat template failed: {e}") from e

    # -- internals -------------------------------------------------------------------------------

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)


def _template_text(path: Path) -> str:
    """chat_template.jinja's text, read as every file inferlab reads (engine/files.py)."""
    try:
        return files.read_text(path, MAX_CONFIG_BYTES)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: not a readable chat template ({getattr(e, 'why', e)})") from e


def _token_text(value: Any) -> str:
    # Special tokens are written either as a string or as a serialized AddedToken dict.
    return value["content"] if isinstance(value, dict) else str(value)


def _has_byte_level_decoder(decoder: Any) -> bool:
    if isinstance(decoder, decoders.ByteLevel):
        return True
    return isinstance(decoder, decoders.Sequence) and "ByteLevel" in repr(decoder)


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable character table used by byte-level BPE vocabularies.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_BYTE_DECODER = {ch: b for b, ch in _bytes_to_unicode().items()}


def _clean_up_tokenization(text: str) -> str:
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


class _GenerationTag(jinja2.ext.Extension):
    # `{% generation %}...{% endgeneration %}` marks assistant text for training masks; rendering
    # just passes the body through.
    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Any) -> list:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # Jinja's own tojson HTML-escapes; chat templates expect plain JSON (as in transformers).
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _compile_template(source: str) -> jinja2.Template:
    # Templates come from downloaded files, so they run sandboxed.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)
