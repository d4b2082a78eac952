"""`inferlab train-lora` on the tiny model: the held-out loss falls, and the saved PEFT folder serves."""
from __future__ import annotations

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.lora.styles import pirate, shout
from engine.lora.train import train_lora


def test_styles_rewrite_deterministically():
    assert shout("Hello, you!") == "HELLO, YOU!"
    assert pirate("Hello my friend, you are the best.") == "Ahoy me matey, ye be th' best. Arr!"


def test_train_lora_lowers_the_held_out_loss_and_serves(tiny_llama, tmp_path):
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=128, max_loras=1))
    prompts = [f"Tell me about item {i}." for i in range(16)]
    report = train_lora(eng, tmp_path / "shout", style="shout", prompts=prompts, rank=4, epochs=3, lr=1e-2,
                        max_tokens=12, targets=("q_proj", "v_proj", "down_proj"))
    assert report["held_out_loss_after"] < report["held_out_loss_before"]
    eng.add_lora("shout", report["path"])
    p = SamplingParams(max_tokens=8, temperature=0.0)
    base, tuned = eng.generate([prompts[0]] * 2, p, lora_names=[None, "shout"])
    assert base.token_ids != tuned.token_ids
