"""Shared fixtures: tiny random Llama / Qwen2 / Qwen3 models saved as Hugging Face folders."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# without the GUI or HTTP stack (the lent GPU image) the tests that need it skip; the rest run
pytest_plugins = ["optional_stacks"]
# Engines built with device="auto" run on the CPU, GPU box or not: the suite's exact figures (block ids,
# budgets, packed CPU kernels) are CPU facts. Tests of the CUDA paths are marked `cuda` and say
# device="cuda" themselves; they skip where torch sees no GPU.
os.environ.setdefault("INFERLAB_DEVICE", "cpu")


def _triton_interpreter_without_a_gpu() -> None:
    """The CUDA path's Triton kernels are tested on the CPU under Triton's interpreter where torch sees no GPU
    (tests/triton_setup.py). TRITON_INTERPRET is read when a kernel is defined, Triton's own library
    functions included, and torch's compiler imports Triton early: so it is set here, before any test module
    is imported. It changes nothing but Triton."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


_triton_interpreter_without_a_gpu()

_TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Paged attention stores keys and values in blocks of sixteen tokens. ",
    "Continuous batching schedules every step; prefill reads the prompt, decode writes one token. ",
    "Hello world! Bonjour le monde. こんにちは世界 🙂 naïve café 12345 + - * / = ( ) [ ] { }",
]


def pytest_configure(config):
    # what the app stores between runs (sweeps, comparisons) goes to a scratch dir, never the user's
    if "INFERLAB_DATA_DIR" not in os.environ:
        import tempfile

        os.environ["INFERLAB_DATA_DIR"] = tempfile.mkdtemp(prefix="inferlab-test-data-")
    config.addinivalue_line("markers", "real_model: needs the real SmolLM2-135M model (slow, downloads a wheel)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    config.addinivalue_line("markers", "llama_server: needs llama.cpp's llama-server (scripts/build_llama_cpp.sh); "
                                       "skips where it is not built")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch sees none)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def build_tokenizer(folder: Path, vocab_size: int = 384) -> int:
    """A small byte-level BPE tokenizer with <|im_start|>/<|im_end|> specials and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_TRAIN_TEXT, trainer=trainer)
    tok.save(str(folder / "tokenizer.json"))
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "unk_token": None, "pad_token": "<|endoftext|>", "chat_template": template,
        "add_bos_token": False, "model_max_length": 256}))
    return tok.get_vocab_size()


def kernel_tiers() -> tuple[str, ...]:
    """Every ISA tier of the native kernels this machine runs (engine/kernels): the tests check each one,
    so an AVX-512 machine checks the AVX2 and portable bodies too."""
    from engine.kernels import supported_tiers

    return supported_tiers()


def has_toolchain() -> bool:
    """What torch's cpp_extension needs to build the kernels: ninja and a C++ compiler."""
    import os
    import shutil

    from torch.utils.cpp_extension import is_ninja_available

    return is_ninja_available() and shutil.which(os.environ.get("CXX", "c++")) is not None


def built_kernel(loader, tier: str):
    """The native kernel module (engine/kernels) built for `tier`. Where a compiler is here, a build that
    fails fails the test (a broken body must not pass as a skip); without one the test is skipped."""
    mod = loader(tier=tier)
    if mod is None:
        if has_toolchain():
            pytest.fail(f"the native kernels ({tier}) did not build although a C++ compiler and ninja are "
                        "present (the warning above says why)")
        pytest.skip("no C++ toolchain to build the kernels")
    assert mod.tier() == tier  # the build runs the body it was asked for (not a fallback)
    return mod


def build_tiny_model(folder: Path, model_type: str = "llama", seed: int = 0, **overrides) -> Path:
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(folder)
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-5, eos_token_id=2, bos_token_id=None, pad_token_id=0)
    common.update(overrides)
    if model_type == "llama":
        cfg = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    elif model_type == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        cls = transformers.Qwen2ForCausalLM
    elif model_type == "qwen3":
        cfg = transformers.Qwen3Config(head_dim=32, **common)
        cls = transformers.Qwen3ForCausalLM
    else:
        raise ValueError(model_type)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():  # random weights with some spread so greedy paths differ per prompt
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_tied(tmp_path_factory) -> Path:
    """A Llama whose lm_head is its embedding table (as in SmolLM2)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-tied"), "llama", tie_word_embeddings=True)


@pytest.fixture(scope="session")
def tiny_llama_hd64(tmp_path_factory) -> Path:
    """head_dim 64 as in SmolLM2: the native decode kernel's case."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-hd64"), "llama", hidden_size=128,
                            num_attention_heads=2, num_key_value_heads=1)


@pytest.fixture(scope="session")
def tiny_llama_8_layers(tmp_path_factory) -> Path:
    """Eight decoder layers: the layers, not the tables, are most of its bytes (loading-memory tests)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-8-layers"), "llama", num_hidden_layers=8)


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2")


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3"), "qwen3")
