"""The CUDA path made right on the CPU: device and dtype choice, budgets on every device, the draft's KV
inside the budget, requantization layer by layer onto the engine's device, a rebuild that frees the old
KV cache first, models that free without the garbage collector, MTP heads on the states' device.

No GPU here: a GPU is stood in for by monkeypatched torch.cuda queries, and placement by the `meta`
device. What only a GPU can prove is in tests/test_cuda.py (marked `cuda`)."""
from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.runner import setup
from engine.runner.setup import gpu_kv_budget, kv_budget_bytes, num_kv_blocks, resolve_device, resolve_dtype

CUDA0 = torch.device("cuda", 0)
GiB = 2**30


@pytest.fixture
def fake_gpu(monkeypatch):
    """torch.cuda's memory queries as a 80 GiB GPU with 70 GiB free (10 GiB in use)."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (70 * GiB, 80 * GiB))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)


def test_auto_device_follows_the_environment(monkeypatch):
    monkeypatch.setenv(setup.DEVICE_ENV, "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU box: the suite still pins the CPU
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.delenv(setup.DEVICE_ENV)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("auto") == CUDA0  # one name per device: "cuda" is "cuda:0"
    with pytest.raises(ValueError, match="sees 1 CUDA device"):
        resolve_device("cuda:3")
    with pytest.raises(ValueError, match="not a device torch knows"):
        resolve_device("gpu")


def test_auto_dtype_is_fp16_on_gpus_without_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))  # Turing
    assert resolve_dtype("auto", CUDA0) == torch.float16
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # Hopper
    assert resolve_dtype("auto", CUDA0) == torch.bfloat16
    assert resolve_dtype("auto", torch.device("cpu")) == torch.bfloat16
    assert resolve_dtype("float32", CUDA0) == torch.float32


def test_explicit_budgets_are_honoured_on_a_gpu(fake_gpu):
    kv = EngineConfig(kv_cache_memory_bytes=256 * 2**20)
    assert kv_budget_bytes(kv, CUDA0, weights_bytes=GiB, weights_saved=0) == 256 * 2**20
    whole = EngineConfig(memory_budget_bytes=2 * GiB)
    assert kv_budget_bytes(whole, CUDA0, weights_bytes=GiB, weights_saved=0) == GiB
    assert num_kv_blocks(whole, CUDA0, block_bytes=2**20, weights_bytes=GiB) == 1024


def test_a_gpu_without_a_budget_is_sized_by_the_profiled_peak(fake_gpu):
    calls = []

    def peak() -> int:
        calls.append(1)
        return 3 * GiB

    cfg = EngineConfig(gpu_memory_utilization=0.5)
    # 80 GiB x 0.5 - 10 GiB in use - 3 GiB peak of a step = 27 GiB
    assert kv_budget_bytes(cfg, CUDA0, weights_bytes=GiB, weights_saved=0, profile_peak=peak) == 27 * GiB
    assert calls == [1]
    assert gpu_kv_budget(total=100, free=60, utilization=0.9, peak_step_bytes=5) == 90 - 40 - 5
    # the CPU keeps its budget and never profiles
    assert kv_budget_bytes(EngineConfig(), torch.device("cpu"), 0, 0, profile_peak=peak) == 512 * 2**20
    assert calls == [1]
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(gpu_memory_utilization=1.5)


def test_the_warmup_runs_the_worst_case_step(tiny_llama):
    """The profile's forward sees max_num_batched_tokens tokens and its sampler max_num_seqs rows; the
    meter's peak less what was allocated before is what it reports."""
    from engine.runner import profile

    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=16,
                                 max_num_batched_tokens=96, max_num_seqs=7))
    shape = profile.worst_case_shape(eng.config, eng.model_config)
    assert (shape.num_prefill_tokens, shape.num_sample_rows) == (96, 7)
    seen = []
    eng.model.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    tokens = profile.warmup_step(eng.model, eng.model_config, shape, 16, eng.device, eng.dtype)
    assert seen == [(96,)] and tokens.shape == (7,) and bool((tokens >= 0).all())

    class Meter:
        def reset(self):
            pass

        def allocated(self):
            return 1000

        def peak(self):
            return 1000 + 4242

    assert profile.profile_peak_bytes(eng.model, eng.model_config, eng.config, eng.device, eng.dtype,
                                      Meter()) == 4242


def test_the_draft_models_kv_comes_out_of_the_same_budget(tiny_llama):
    budget = 4 * 2**20
    plain = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", kv_cache_memory_bytes=budget))
    spec = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", kv_cache_memory_bytes=budget,
                                  spec_method="draft", num_speculative_tokens=2))
    draft_runner = spec.proposer.runner
    target_kv = spec.runner.kv_cache_bytes
    assert plain.block_manager.num_blocks == budget // plain.block_bytes
    # a self-draft has the target's shapes: the two caches of one block count split the budget
    assert spec.block_manager.num_blocks == budget // (2 * spec.block_bytes)
    assert target_kv + draft_runner.kv_cache_bytes <= budget
    assert draft_runner.kv_caches[0][0].shape == spec.runner.kv_caches[0][0].shape
    out = spec.generate(["Hello there"], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    ref = plain.generate(["Hello there"], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    assert out[0].token_ids == ref[0].token_ids


def test_requantization_builds_each_layer_on_the_models_device(tiny_llama):
    """Originals stay on the host; each goes to the target device only for its own module (here the
    meta device stands in for a GPU: every new module lands there, no original moves)."""
    from engine.quant.weight_only import quantize_model

    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=16))
    originals = eng.weights.originals
    moved = []

    class Watched(dict):
        def __getitem__(self, name):
            moved.append(name)
            return dict.__getitem__(self, name)

    meta = torch.device("meta")
    for fmt in ("int8", "int4", "bf16"):
        moved.clear()
        modules = quantize_model(eng.model, Watched(originals), fmt, 32, device=meta)
        devices = {t.device for m in modules.values() for t in list(m.parameters()) + list(m.buffers())}
        assert devices == {meta}, fmt
        assert {t.device.type for t in originals.values()} == {"cpu"}
        assert len(moved) == len(set(moved))  # each original fetched once, in turn


def test_quantizing_at_start_swaps_layer_by_layer(tiny_llama):
    """install=True: each new module replaces its layer before the next is built, so the 16-bit layer
    it replaces is free by then (counted: 16-bit Linear weights alive while the 4-bit ones are made)."""
    from engine.models.layers.linear import Linear
    from engine.quant.weight_only import QUANTIZABLE, original_weights, quantize_model

    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=16))
    model = eng.model
    originals = {n: w.clone() for n, w in original_weights(model).items()}  # the host copies
    alive = []

    def progress(_msg, _fraction):
        alive.append(sum(1 for n, m in model.named_modules()
                         if n.split(".")[-1] in QUANTIZABLE and type(m) is Linear))

    quantize_model(model, originals, "int4", 32, progress=progress, install=True)
    total = len(alive)
    assert alive == list(range(total - 1, -1, -1))  # one fewer 16-bit layer after each step


def test_a_rebuild_frees_the_old_kv_cache_before_building(tiny_llama):
    from engine.serving.commands import Rebuild
    from engine.serving.loop import EngineLoop

    seen = {}
    built = threading.Event()

    def build(config, progress=None):
        if "first" in seen:  # a rebuild: what the running engine holds now
            seen["old_kv"] = list(seen["first"].runner.kv_caches)
        eng = LLMEngine(config)
        seen.setdefault("first", eng)
        built.set()
        return eng

    loop = EngineLoop(config=EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=32), build=build)
    loop.start()
    try:
        assert built.wait(60)
        built.clear()
        first = seen["first"]
        loop.post(Rebuild({"num_kv_blocks": 24}))
        assert built.wait(60)
        assert seen["old_kv"] == []  # released before the new engine was made
        assert first.runner.kv_caches == []
    finally:
        assert loop.stop(5)


def test_release_and_restore_keep_an_engine_serving(tiny_llama):
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=32))
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    before = eng.generate(["a b c"], params)[0].token_ids
    eng.release_memory()
    assert eng.runner.kv_caches == [] and eng.block_manager.num_cached_free_blocks == 0
    eng.restore_memory()
    assert eng.generate(["a b c"], params)[0].token_ids == before
    draft = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=32, spec_method="draft",
                                   num_speculative_tokens=2))
    before = draft.generate(["a b c"], params)[0].token_ids
    draft.release_memory(offload_weights=True)  # what a GPU does: weights to the host too
    assert draft.proposer.runner.kv_caches == []
    draft.restore_memory()
    assert draft.generate(["a b c"], params)[0].token_ids == before


@pytest.mark.parametrize("extra", [{}, {"max_loras": 2}, {"spec_method": "draft", "num_speculative_tokens": 2},
                                   {"quant_format": "int4"}, {"cuda_graphs": True, "attention_backend": "fast"}],
                         ids=["plain", "lora", "draft", "int4", "graphs"])
def test_a_dropped_engine_frees_its_model_without_the_garbage_collector(tiny_llama, extra):
    gc.disable()
    try:
        eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=16, **extra))
        eng.generate(["hi"], SamplingParams(max_tokens=2))
        eng.memory(), eng.block_map()
        eng.model.set_compiled(True)
        eng.model.set_compiled(False)  # compiling holds bound methods only while it is on
        model, kv = weakref.ref(eng.model), weakref.ref(eng.runner.kv_caches[0][0])
        del eng
        assert model() is None and kv() is None
    finally:
        gc.enable()


def test_mtp_heads_train_on_the_hidden_states_device():
    from engine.spec.mtp_train import train_heads

    meta = torch.device("meta")  # stands in for a GPU: where the engine's hidden states are
    h = torch.randn(40, 16, device=meta)
    nxt = torch.randint(0, 50, (40,), device=meta)
    labels = torch.randint(0, 50, (40, 3), device=meta)
    weights = (torch.randn(50, 16, device=meta), torch.randn(50, 16, device=meta))
    # full_vocab: the default softmax shortlist (unique token ids) has a data-dependent size, which the
    # meta device cannot have; on a GPU it runs where the states are like the rest (test_cuda.py)
    heads = train_heads(h, nxt, labels, weights, 3, epochs=1, batch=16, full_vocab=True)
    assert {p.device for p in heads.parameters()} == {meta}


class FakeNvml:
    """pynvml's few calls: the machine has GPUs at bus 3b and 5e; torch sees only the second (as
    CUDA_VISIBLE_DEVICES=1 would make it), and calls it cuda:0."""

    def __init__(self):
        self.inits = 0
        self.lookups = []

    def nvmlInit(self):  # noqa: N802 (pynvml's names)
        self.inits += 1

    def nvmlDeviceGetHandleByUUID(self, uuid):  # noqa: N802
        self.lookups.append(("uuid", uuid))
        if uuid != b"GPU-5e":
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return "handle-5e"

    def nvmlDeviceGetHandleByPciBusId(self, bus):  # noqa: N802
        self.lookups.append(("pci", bus))
        return {b"00000000:5e:00.0": "handle-5e"}[bus]

    def nvmlDeviceGetMemoryInfo(self, handle):  # noqa: N802
        class Info:
            total, free = (80 * GiB, 50 * GiB) if handle == "handle-5e" else (1, 1)
        return Info()


def _props(monkeypatch, uuid):
    class Props:
        pci_domain_id, pci_bus_id, pci_device_id = 0, 0x5E, 0

    Props.uuid = uuid
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Props)


def test_nvml_finds_the_gpu_by_uuid_initialised_once(monkeypatch):
    from engine.runner.memory import DeviceMemory, snapshot

    _props(monkeypatch, "5e")  # torch's uuid lacks NVML's "GPU-" prefix
    nvml = FakeNvml()
    mem = DeviceMemory(CUDA0, nvml)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 12 * GiB)
    snaps = [snapshot(mem, weights=8 * GiB, kv_block_bytes=GiB, blocks_total=3, blocks_used=1, blocks_cached=0,
                      activation_bytes=0) for _ in range(3)]
    assert nvml.inits == 1 and nvml.lookups == [("uuid", b"GPU-5e")]
    snap = snaps[-1]
    assert (snap.device_total_bytes, snap.free_bytes, snap.source) == (80 * GiB, 50 * GiB, "nvml")
    # this process holds 12 GiB in the allocator: 8 weights + 3 KV + 1 other; the 18 GiB that other
    # processes hold (80 - 50 - 12) are never the engine's
    assert snap.other_bytes == GiB


def test_nvml_falls_back_to_the_pci_bus_id(monkeypatch):
    from engine.runner.memory import DeviceMemory

    _props(monkeypatch, None)  # an older torch: no uuid
    nvml = FakeNvml()
    assert DeviceMemory(CUDA0, nvml).info() == (80 * GiB, 50 * GiB, "nvml")
    assert nvml.lookups == [("pci", b"00000000:5e:00.0")]


def test_block_snapshot_lists_only_blocks_in_use_or_cached():
    from engine.core.block_manager import BlockManager

    bm = BlockManager(300_000, 16)
    tokens = list(range(40))
    bm.allocate("a", tokens, 40)
    bm.commit("a", tokens, 40)
    bm.allocate("b", tokens, 40)  # shares a's two full blocks from the prefix cache
    bm.free("a")
    snap = bm.snapshot()
    walked = [b for b in range(bm.num_blocks) if bm.ref_count(b) or b in {i.block_id for i in snap.blocks}]
    assert [i.block_id for i in snap.blocks] == walked == sorted(set(bm.block_table("b")))
    assert [i.owners for i in snap.blocks] == [("b",)] * 3
    assert [i.cached for i in snap.blocks] == [True, True, False]


def test_the_app_and_commands_take_a_device_and_a_memory_share():
    from app.cli import build_parser

    args = build_parser().parse_args(["--device", "cuda:1", "--gpu-memory-utilization", "0.5"])
    assert (args.device, args.gpu_memory_utilization) == ("cuda:1", 0.5)
    assert build_parser().parse_args([]).gpu_memory_utilization == 0.8  # the display's GPU: room left
    gen = build_parser().parse_args(["generate", "--prompt", "x", "--device", "cpu"])
    assert (gen.device, gen.gpu_memory_utilization) == ("cpu", 0.9)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--gpu-memory-utilization", "1.5"])


def _count_readbacks(monkeypatch) -> list:
    """Every .tolist() counted; .item(), float() and int() of a tensor fail the test (each a device wait)."""
    calls: list = []
    tolist = torch.Tensor.tolist

    def forbidden(self, *a):
        raise AssertionError("a per-element read-back")

    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: calls.append(1) or tolist(self))
    for name in ("item", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    return calls


def test_sampling_reads_back_once_per_step(monkeypatch):
    from engine.models.layers.sampler import sample

    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    logits[4] = float("nan")
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_p=0.9, seed=1),
              SamplingParams(temperature=1.0, top_k=5, logprobs=3), SamplingParams(temperature=0.0, logprobs=1),
              SamplingParams(temperature=0.9), SamplingParams(temperature=1.3)]
    gens = [torch.Generator().manual_seed(i) for i in range(6)]
    want = sample(logits.clone(), params, [torch.Generator().manual_seed(i) for i in range(6)])
    calls = _count_readbacks(monkeypatch)
    got = sample(logits.clone(), params, gens)
    assert len(calls) == 1  # the tokens, failed rows, top ids and the logprob values (their float32 bits)
    assert got.token_ids == want.token_ids and got.failed == [4] and got.token_ids[4] is None
    assert got.token_ids[0] == int(logits[0].argmax().tolist()) and got.token_ids[3] == int(logits[3].argmax().tolist())
    lp, alts = got.logprobs[2]
    assert len(alts) == 3 and got.logprobs[3][1][0][0] == got.token_ids[3] and got.logprobs[0] is None
    calls.clear()
    sample(logits[:2].clone(), params[:2], gens[:2])
    assert len(calls) == 1


def test_acceptance_reads_back_once_and_stays_exact(monkeypatch):
    from engine.events import TokenSource
    from engine.spec.verify import verify

    logits = torch.full((4, 20), -5.0)
    logits[0, 3] = logits[1, 7] = logits[2, 9] = logits[3, 11] = 5.0  # the target's argmax: 3, 7, 9 / bonus 11
    greedy = SamplingParams(temperature=0.0)
    calls = _count_readbacks(monkeypatch)
    full = verify([3, 7, 9], logits, greedy, None)
    assert (full.tokens, full.num_accepted, full.sources[-1]) == ([3, 7, 9, 11], 3, TokenSource.BONUS)
    part = verify([3, 8, 9], logits, greedy, None)
    assert (part.tokens, part.num_accepted, part.sources) == \
        ([3, 7], 1, [TokenSource.ACCEPTED, TokenSource.CORRECTED])
    top1 = SamplingParams(temperature=1.0, top_k=1)
    calls.clear()
    verify([3, 7, 9], logits, SamplingParams(temperature=0.8), torch.Generator().manual_seed(0), batched=True)
    assert len(calls) == 1  # the GPU's sampling path: one copy back for every draft
    monkeypatch.undo()
    # sampling where top_k=1 leaves p(x) = 1: accepted, never a sample from an empty residual
    for batched in (True, False):
        res = verify([3, 7, 9], logits, top1, torch.Generator().manual_seed(0), batched=batched)
        assert res.tokens == [3, 7, 9, 11]
        res = verify([4], logits, top1, torch.Generator().manual_seed(0), batched=batched)
        assert (res.tokens, res.sources) == ([3], [TokenSource.CORRECTED])


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "sequential"])
def test_acceptance_emits_the_targets_distribution(batched):
    """With a one-hot proposal x, the first emitted token is distributed as the target's p, whichever
    way acceptance runs (the batched one, which the model runner's step read-back uses, draws every
    position's decision on the device up front: engine/spec/verify.py decide_on_device)."""
    from engine.spec.verify import verify

    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = p.log().expand(3, 4).clone()
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    trials = 4000
    for _ in range(trials):
        counts[verify([2, 3], logits, params, gen, batched=batched).tokens[0]] += 1
    assert torch.allclose(counts / trials, p, atol=0.025), counts / trials


def _materialized_bytes(model) -> int:
    """Bytes the model holds on its device: tensors still on `meta` (pieces not made yet) take none."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.is_meta or id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total


def test_quantizing_while_loading_keeps_the_peak_at_4_bits_plus_one_layer(tiny_llama_8_layers):
    """Meta-device accounting: pieces not yet loaded hold no memory; each layer is quantized as soon as
    it is filled. The peak is the 4-bit model plus one 16-bit layer, below what bf16 alone needs: a
    device that cannot hold the bf16 model holds this one."""
    from engine.loading.loader import load_model
    from engine.models.build import build_model
    from engine.quant.at_load import QuantizeAtLoad
    from engine.quant.weight_only import QuantLinear

    loaded = load_model(str(tiny_llama_8_layers))
    cpu = torch.device("cpu")
    bf16 = _materialized_bytes(build_model(loaded.config, loaded.state_dict, cpu, torch.bfloat16))
    seen = []

    class Accounted(QuantizeAtLoad):
        def __call__(self, model, index):
            seen.append(_materialized_bytes(model))  # this layer filled in 16 bits, not yet quantized
            super().__call__(model, index)

    hook = Accounted("int4", 32)
    model = build_model(loaded.config, loaded.state_dict, cpu, torch.bfloat16, on_layer=hook)
    int4 = _materialized_bytes(model)
    assert all(isinstance(model.get_submodule(n), QuantLinear) for n in hook.originals)
    assert len(hook.originals) == 8 * 4 and {w.dtype for w in hook.originals.values()} == {torch.bfloat16}
    peak = max(seen + [int4])
    assert peak <= int4 + hook.peak_layer_bytes
    assert peak < 0.7 * bf16  # a device of 70 % of the bf16 model's size holds it
def test_an_engine_quantized_while_loading_runs_as_one_quantized_after(tiny_llama_8_layers, monkeypatch):
    """The GPU's start-up path (quantize each layer as it loads), forced on the CPU: the same tokens,
    weight bytes, KV blocks and host originals as quantizing after the full load; requantizing from
    those originals back to 16 bits gives the unquantized model's tokens."""
    from engine.quant import at_load

    folder = str(tiny_llama_8_layers)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    cfg = EngineConfig(model=folder, quant_format="int4", memory_budget_bytes=8 * 2**20)
    late = LLMEngine(cfg)
    assert not at_load.applies(cfg, torch.device("cpu")) and at_load.applies(cfg, CUDA0)
    assert not at_load.applies(EngineConfig(quant_format="int4", quant_outlier_channels=4), CUDA0)
    monkeypatch.setattr(at_load, "applies", lambda config, device: config.quant_format != "bf16")
    early = LLMEngine(cfg)
    assert early.generate(["Hello"], params)[0].token_ids == late.generate(["Hello"], params)[0].token_ids
    assert (early.weights_bytes, early.block_manager.num_blocks) == (late.weights_bytes, late.block_manager.num_blocks)
    assert early.weights.originals.keys() == late.weights.originals.keys()
    assert all(torch.equal(early.weights.originals[n], w) for n, w in late.weights.originals.items())
    plain = LLMEngine(EngineConfig(model=folder, num_kv_blocks=16))
    early.set_quantization("bf16")
    assert early.generate(["Hello"], params)[0].token_ids == plain.generate(["Hello"], params)[0].token_ids


def test_decode_graph_buffers_give_the_ordinary_paths_tokens(tiny_llama):
    """cuda_graphs=True on the CPU: all-decode steps run through the padded static buffers (batch and
    context buckets, padding rows repeating row 0, masks built on the device) without capture; the
    tokens are the ordinary path's, across bucket changes, a requantization and a rebuilt cache."""
    from engine.runner.graphs import batch_bucket, context_bucket

    assert [batch_bucket(n) for n in (1, 3, 5, 17, 64, 65, 300)] == [1, 4, 8, 24, 64, 96, None]
    assert [context_bucket(n) for n in (1, 2, 3, 5, 9)] == [1, 2, 4, 8, 16]
    prompts = ["Hello there", "The quick brown fox jumps over", "a", "Paged attention stores keys and values",
               "one two three four five six seven"]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    kw = dict(model=str(tiny_llama), dtype="float32", attention_backend="fast", num_kv_blocks=64)
    plain = LLMEngine(EngineConfig(**kw))
    graphs = LLMEngine(EngineConfig(**kw, cuda_graphs=True))
    want = [o.token_ids for o in plain.generate(prompts, params)]
    assert [o.token_ids for o in graphs.generate(prompts, params)] == want
    used = graphs.runner.graphs.num_runs
    assert used > 30 and graphs.runner.graphs.num_replays == 0  # no capture without CUDA
    for eng in (plain, graphs):
        eng.weights.fit_kv(eng.block_manager, eng.runner)
    plain.set_quantization("int8")
    graphs.set_quantization("int8")
    want = [o.token_ids for o in plain.generate(prompts[:3], params)]
    assert [o.token_ids for o in graphs.generate(prompts[:3], params)] == want
    assert graphs.runner.graphs.num_runs > used
