"""The speculative decoder: the engine's part that makes the proposer, asks it for drafts before
scheduling, and turns each verify run into accepted / corrected / bonus tokens.

A draft of k tokens costs one target pass to check (the verify run: the last token plus the drafts in
one forward), so a step emits 1 + accepted tokens instead of 1; the proposers (n-gram lookup, a draft
model, MTP heads) trade how cheap a draft is against how often it is accepted. The acceptance rule
(exact for greedy and for sampling) is in engine/spec/verify.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.output_processor import append_token
from engine.core.request import Request
from engine.core.scheduler import ScheduledRequest
from engine.events import SpecDecodeStats, SpecMethod
from engine.loading.loader import LoadedModel
from engine.models.llama import LlamaForCausalLM
from engine.models.model_config import ModelConfig
from engine.runner.attention_backend import for_model
from engine.runner.model_runner import ModelRunner, tree_depths
from engine.spec.draft import DraftModel, DraftModelProposer, build_draft_model
from engine.spec.draft_length import MAX_DRAFT, DraftLength
from engine.spec.mtp import MtpProposer, find_heads, heads_path, load_heads
from engine.spec.verify import NgramProposer, chain_parents, decide_on_device, verify, verify_tree


def verify_decisions(s: ScheduledRequest, logits: torch.Tensor) -> torch.Tensor:
    """The model runner's hook (ModelRunner.verify_decisions): a verify run's decisions, on the device,
    for the runner to read back with the step's sampled tokens (engine/spec/verify.py, decide_on_device).
    `logits`: (s.num_tokens, vocab), non-finite rows already replaced (the request fails; nothing is walked)."""
    req = s.request
    draft = req.spec_token_ids[: s.num_tokens - 1]
    parents = req.spec_tree[: len(draft)] if req.spec_tree else chain_parents(len(draft))
    return decide_on_device(draft, parents, logits, req.sampling_params, req.generator)




@dataclass(slots=True)
class VerifyOutcome:
    """What one verify run added to its request: the tokens (accepted drafts, then the corrected or
    bonus token; cut at a stop), their text, and where each came from."""

    token_ids: list[int]
    text: str
    sources: list[str]


class SpeculativeDecoder:
    """Owns the proposer and the speculation counters. It reads the running requests it is handed,
    writes their drafts (spec_token_ids / spec_tree), and keeps the target's KV blocks in step with
    what a verify run accepted (block_manager, runner.move_slots)."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel, target: LlamaForCausalLM,
                 model_config: ModelConfig, runner: ModelRunner, block_manager: BlockManager,
                 eos_token_ids: frozenset[int], max_model_len: int, draft: DraftModel | None = None) -> None:
        """`draft`: the draft model, built (build_draft_model) before the KV cache was sized, so that its
        weights and its KV blocks came out of the same budget as the target's."""
        self.runner, self.block_manager = runner, block_manager
        runner.verify_decisions = verify_decisions  # a plain function: no reference back to this decoder
        self.eos_token_ids, self.max_model_len = eos_token_ids, max_model_len
        self.block_size = config.block_size
        self.num_tokens = config.num_speculative_tokens  # k, drafted per request and step (reconfigurable)
        self.mtp_max_tree_tokens = config.mtp_max_tree_tokens
        # the draft length per step from measured step costs and acceptance (None: always num_tokens)
        self.draft_length = DraftLength(MAX_DRAFT) if config.adaptive_draft_length else None
        self._chances: dict[str, list[float]] = {}  # request -> its drafts' predicted chances (MTP chains)
        self.proposer = None
        self.totals = dict(draft=0, accepted=0, emitted=0, verify=0)
        self.accepted_per_pos = [0] * MAX_DRAFT
        self.drafted_per_pos = [0] * MAX_DRAFT
        self._step_spec = None
        method = config.spec_method
        if method is None:
            return
        if method == SpecMethod.NGRAM:
            self.proposer = NgramProposer()
        elif method == SpecMethod.DRAFT:
            self.proposer = self._make_draft(config, draft, loaded, model_config)
        elif method == SpecMethod.MTP:
            self.proposer = self._make_mtp(config, loaded, target, model_config)
            self.runner.keep_hidden = True
        else:
            raise ValueError(f"spec_method must be None, 'draft', 'ngram' or 'mtp', got {method!r}")

    def set_num_tokens(self, k: int) -> None:
        self.num_tokens = k

    def switch(self, method: SpecMethod | None, running: list[Request]) -> None:
        """Switch the proposer (checked by engine.validation.check_reconfigure: none and n-gram switch at run
        time); drafts already made are dropped."""
        if method is None:
            self._free_all_drafts()
            self.proposer = None
        elif method == SpecMethod.NGRAM and not isinstance(self.proposer, NgramProposer):
            self._free_all_drafts()
            self.proposer = NgramProposer()
        self.runner.keep_hidden = isinstance(self.proposer, MtpProposer)
        if self.draft_length is not None:  # another proposer's drafts are accepted at other rates
            self.draft_length.forget_acceptance()
        self._chances.clear()
        for r in running:
            r.spec_token_ids.clear()
            r.spec_tree.clear()

    def _free_all_drafts(self) -> None:
        if isinstance(self.proposer, DraftModelProposer):
            for rid in list(self.proposer.computed):
                self.proposer.free(rid)

    def _make_draft(self, cfg: EngineConfig, draft: DraftModel | None, target_loaded: LoadedModel,
                    target_config: ModelConfig) -> DraftModelProposer:
        device, dtype = self.runner.device, self.runner.dtype
        draft = draft or build_draft_model(cfg, target_loaded, target_config, device, dtype)
        # the target's attention backend, less the native kernel where the draft's head shapes rule it out
        return DraftModelProposer(draft.model, draft.config, self.block_manager.num_blocks, cfg.block_size, device,
                                  dtype, for_model(self.runner.backend, draft.config, device, dtype))

    def _make_mtp(self, cfg: EngineConfig, loaded: LoadedModel, target: LlamaForCausalLM,
                  target_config: ModelConfig) -> MtpProposer:
        path = find_heads(loaded.path, cfg.mtp_heads)
        if path is None:
            raise ValueError(f"spec_method 'mtp' needs prediction heads trained for this model, and there are "
                             f"none at {cfg.mtp_heads or heads_path(loaded.path)}: run `inferlab train-mtp "
                             f"--model {cfg.model}` (a few minutes on the CPU), or pass EngineConfig(mtp_heads=...)")
        heads, meta = load_heads(path, target_config.hidden_size, target_config.vocab_size,
                                 max(cfg.mtp_tree_widths, default=1))
        # float32 on the CPU: the heads are small (2·hidden² each), and a CPU without native bf16 multiplies
        # bf16 matrices very slowly (the engine's own bf16 products go through the native kernels instead)
        dtype = torch.float32 if self.runner.device.type == "cpu" else self.runner.dtype
        heads = heads.to(device=self.runner.device, dtype=dtype).eval()
        return MtpProposer(heads, target, tuple(cfg.mtp_tree_widths), meta)

    def _propose_mtp(self, want: dict, num_decoding: int) -> None:
        ready = [(r, kr) for r, kr in want.values() if r.mtp_hidden is not None]
        if not ready:
            return
        hidden = torch.stack([r.mtp_hidden for r, _ in ready])
        depths = [min(kr, self.proposer.heads.num_heads) for _, kr in ready]
        # Many requests verifying at once make the step compute-bound: share a budget of tree rows. Where
        # the runner has the fused native step (the CPU), one chain each: a chain's verify takes that step,
        # a tree's runs layer by layer (2 streams, quiet 2-core CPU: plain 111 tok/s, chain of 3 92, tree
        # (3, 2, 1) 42; same output as plain with the chain).
        chain = self.runner.fused is not None
        max_nodes = max(max(depths), self.mtp_max_tree_tokens // len(ready))
        last = [r.token_slice(r.num_tokens - 1, r.num_tokens)[0] for r, _ in ready]
        if chain and self.draft_length is not None:  # each request drafts as far as its chances pay
            if not self.draft_length.worth_proposing(num_decoding):
                return
            chains = self.proposer.propose_chains(hidden, depths, last)
            counts = self.draft_length.choose_drafts([chances for _, chances in chains], num_decoding)
            for (r, _), (tokens, chances), c in zip(ready, chains, counts):
                r.spec_token_ids, r.spec_tree = tokens[:c], list(range(c))
                self._chances[r.request_id] = chances[:c]
            return
        proposals = self.proposer.propose_batch(hidden, depths, max_nodes, last, chain=chain)
        for (r, _), (tokens, parents) in zip(ready, proposals):
            r.spec_token_ids, r.spec_tree = tokens, list(parents)

    def propose(self, running: list[Request]) -> None:
        """Drafts for the running requests about to decode (before the scheduler counts them)."""
        k = min(self.num_tokens, MAX_DRAFT)
        if self.proposer is None or k <= 0:
            return
        want = {}
        decoding = [r for r in running if r.num_tokens - r.num_computed_tokens == 1]
        for r in decoding:
            room = min(r.sampling_params.max_tokens - r.num_output_tokens, self.max_model_len - r.num_tokens) - 1
            if room > 0:
                want[r.request_id] = (r, min(k, room))
        # MTP chains on the fused step choose per request from the heads' confidence (_propose_mtp); the other
        # proposers say nothing of how sure they are: one length for every request of the step
        per_request = isinstance(self.proposer, MtpProposer) and self.runner.fused is not None
        if self.draft_length is not None and want and not per_request:
            k = self.draft_length.choose(len(decoding), k)
            want = {rid: (r, min(kr, k)) for rid, (r, kr) in want.items() if k > 0}
        if isinstance(self.proposer, MtpProposer):
            self._propose_mtp(want, len(decoding))
        elif isinstance(self.proposer, NgramProposer):
            for r, kr in want.values():
                r.spec_token_ids = self.proposer.propose(r.all_token_ids, kr)
        elif want:
            drafts = self.proposer.propose_batch([r for r, _ in want.values()], k)
            for rid, tokens in drafts.items():
                r, kr = want[rid]
                r.spec_token_ids = tokens[:kr]

    def apply_verify(self, s: ScheduledRequest, logits: torch.Tensor, hidden: torch.Tensor | None = None,
                     read_back: list[int] | None = None) -> VerifyOutcome:
        """Accept what the verify run confirms, append it to the request (which may finish) and give
        back the KV of rejected drafts. The caller publishes the outcome and finishes the request.
        `read_back`: the run's decisions, read back with the step's tokens (verify_decisions)."""
        req = s.request
        draft = list(req.spec_token_ids)
        req.spec_token_ids.clear()
        if req.spec_tree:
            parents = req.spec_tree[: len(draft)]
            req.spec_tree = []
            res = verify_tree(draft, parents, logits, req.sampling_params, req.generator, read_back)
            self._keep_tree_path(req, res.path)
            if hidden is not None:  # the row that produced the corrected or bonus token
                req.mtp_hidden = hidden[res.path[-1] if res.path else 0]
            drafted = max(tree_depths(parents))
        else:
            res = verify(draft, logits, req.sampling_params, req.generator, read_back=read_back)
            drafted = len(draft)
        chances = self._chances.pop(req.request_id, None)
        if chances and self.draft_length is not None:
            self.draft_length.observe_confident_verify(chances, res.num_accepted)
        req.num_computed_tokens += 1 + res.num_accepted  # the last token and the accepted drafts
        out = VerifyOutcome([], "", [])
        for tok, src in zip(res.tokens, res.sources):
            out.text += append_token(req, tok, self.eos_token_ids, self.max_model_len)
            out.token_ids.append(tok)
            out.sources.append(src)
            if req.is_finished:
                break
        self._count(drafted, res.num_accepted, len(out.token_ids))
        if isinstance(self.proposer, DraftModelProposer):
            self.proposer.rollback(req.request_id, req.num_computed_tokens)
        if not req.is_finished:
            self.block_manager.truncate(req.request_id, req.num_tokens)  # blocks of rejected drafts
        self.block_manager.commit(req.request_id, req.tokens, req.num_computed_tokens)
        return out

    def _keep_tree_path(self, req: Request, path: list[int]) -> None:
        """The accepted path's K/V were written at the slots of their tree rows; move them to the
        positions they now hold (row path[j] -> the position after the last known token + j)."""
        bs = self.block_size
        table = self.block_manager.block_table(req.request_id)
        start = req.num_computed_tokens  # the last known token's position (tree row 0)

        def slot(pos: int) -> int:
            return table[pos // bs] * bs + pos % bs

        self.runner.move_slots([(slot(start + row), slot(start + 1 + j))
                                for j, row in enumerate(path) if row != j + 1])

    def observe_step(self, requests: int, rows: int, seconds: float) -> None:
        """A step of only decodes and verifies took `seconds` from its proposal on (LLMEngine._step)."""
        if self.draft_length is not None and self.proposer is not None:
            self.draft_length.observe_step(requests, rows, seconds)

    def _count(self, drafted: int, accepted: int, emitted: int) -> None:
        if self.draft_length is not None:
            self.draft_length.observe_verify(drafted, accepted)
        t, st = self.totals, self._step_spec
        for c in (t, st):
            c["draft"] += drafted
            c["accepted"] += accepted
            c["emitted"] += emitted
            c["verify"] += 1
        for i in range(drafted):
            self.drafted_per_pos[i] += 1
            st["drafted_pos"][i] += 1
            if i < accepted:
                self.accepted_per_pos[i] += 1
                st["accepted_pos"][i] += 1

    def begin_step(self) -> None:
        self._step_spec = dict(draft=0, accepted=0, emitted=0, verify=0, drafted_pos=[0] * MAX_DRAFT,
                               accepted_pos=[0] * MAX_DRAFT)

    def step_event(self, step: int) -> SpecDecodeStats | None:
        if self.proposer is None:
            return None
        st = self._step_spec
        k = max(1, self.num_tokens)
        alpha = self.totals["accepted"] / self.totals["draft"] if self.totals["draft"] else 0.0
        # Predicted tokens per verify pass for an acceptance rate alpha and draft length k (Leviathan
        # et al.), ignoring the proposer's own cost: (1 - alpha^(k+1)) / (1 - alpha).
        predicted = (1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1.0
        return SpecDecodeStats(step=step, method=self.proposer.name, num_draft_tokens=st["draft"],
                               num_accepted_tokens=st["accepted"], num_emitted_tokens=st["emitted"],
                               num_verify_passes=st["verify"],
                               accepted_per_position=tuple(st["accepted_pos"][:k]),
                               drafted_per_position=tuple(st["drafted_pos"][:k]),
                               predicted_speedup=predicted,
                               draft_length=self.draft_length.last if self.draft_length is not None else k)

    def release_kv(self) -> int:
        """Free the draft model's KV tensors (LLMEngine.release_memory); returns its block count."""
        if not isinstance(self.proposer, DraftModelProposer):
            return 0
        self._free_all_drafts()
        return self.proposer.runner.release_kv()

    def move_draft(self, device) -> None:
        """The draft model's weights to `device` (host memory while a rebuild makes the next engine)."""
        if isinstance(self.proposer, DraftModelProposer):
            self.proposer.model.to(device)

    def restore_kv(self, num_blocks: int) -> None:
        if num_blocks and isinstance(self.proposer, DraftModelProposer):
            self.proposer.runner.restore_kv(num_blocks)

    def free(self, request_id: str) -> None:
        """A request finished: the draft model's shadow cache for it goes."""
        self._chances.pop(request_id, None)
        if isinstance(self.proposer, DraftModelProposer):
            self.proposer.free(request_id)
