"""`inferlab generate` when its request ends in error (issue 48, point 7): NaN logits printed nothing and
exited 0, and `--stats` raised a TypeError (no first token to time). An error is now one line on stderr
and exit status 1, with or without --stats; a request that succeeds still exits 0."""
from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from app.cli import main


@pytest.fixture(scope="module")
def nan_model(tiny_llama, tmp_path_factory):
    """The tiny model with a final norm of NaN: every logit is NaN, the request fails in its first step."""
    folder = tmp_path_factory.mktemp("nan-model") / "model"
    shutil.copytree(tiny_llama, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.norm.weight"] = torch.full_like(tensors["model.norm.weight"], float("nan"))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("stats", [False, True])
def test_a_failed_request_is_one_error_line_and_exit_1(nan_model, capsys, stats):
    argv = ["generate", "--model", str(nan_model), "--prompt", "hi", "--max-tokens", "4", "--dtype", "float32"]
    assert main(argv + (["--stats"] if stats else [])) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("inferlab: error:") == 1, err
    line = err.split("inferlab: error:")[1].strip()
    assert line == "the request failed: the model produced non-finite logits (NaN or inf) for this request", line
    if stats:
        assert "TTFT none" in err


def test_a_request_that_succeeds_still_exits_0(tiny_llama, capsys):
    argv = ["generate", "--model", str(tiny_llama), "--prompt", "hi", "--max-tokens", "3", "--dtype", "float32",
            "--stats"]
    assert main(argv) == 0
    assert "inferlab: error" not in capsys.readouterr().err
