"""The engine's speculative decoding: make the proposer, ask it for drafts before scheduling, and turn
each verify run into accepted / corrected / bonus tokens. Mixed into LLMEngine."""
from __future__ import annotations

from pathlib import Path

import torch

from engine.core.output_processor import append_token, make_output
from engine.events import SpecDecodeStats
from engine.loading.loader import load_model
from engine.models.layers.linear import pack_linears
from engine.models.llama import LlamaForCausalLM
from engine.quant.weight_only import original_weights, quantize_model, swap_modules
from engine.runner.kernels import native_decode_applies
from engine.runner.model_runner import tree_depths
from engine.spec.draft import DraftModelProposer
from engine.spec.mtp import MtpProposer, heads_path, load_heads
from engine.spec.verify import NgramProposer, verify, verify_tree

MAX_DRAFT = 8


class SpeculativeDecoding:
    """Needs from the engine: config, scheduler, block_manager, device, dtype, tokenizer, model_config,
    eos_token_ids, max_model_len, _counts, _finish()."""

    def _init_spec(self, loaded) -> None:
        self.proposer = None
        self.spec_totals = dict(draft=0, accepted=0, emitted=0, verify=0)
        self.spec_accepted_per_pos = [0] * MAX_DRAFT
        self.spec_drafted_per_pos = [0] * MAX_DRAFT
        self._step_spec = None
        method = self.config.spec_method
        if method in (None, "none"):
            return
        if method == "ngram":
            self.proposer = NgramProposer()
        elif method == "draft":
            self.proposer = self._make_draft(loaded)
        elif method == "mtp":
            self.proposer = self._make_mtp(loaded)
            self.runner.keep_hidden = True
        else:
            raise ValueError(f"spec_method must be None, 'draft', 'ngram' or 'mtp', got {method!r}")

    def _check_spec_switch(self, method: str | None) -> None:
        """At run time the proposer can switch between none and n-gram lookup, or stay as it is; a
        draft model is loaded only at start-up (its weights take a while to load)."""
        current = self.proposer.name if self.proposer else None
        if method not in (None, "none", "ngram", current):
            raise ValueError(f"cannot switch speculation to {method!r} at run time; start the engine with it")

    def _switch_spec(self, method: str | None) -> None:
        if method in (None, "none"):
            self._free_all_drafts()
            self.proposer = None
        elif method == "ngram" and not isinstance(self.proposer, NgramProposer):
            self._free_all_drafts()
            self.proposer = NgramProposer()
        self.runner.keep_hidden = isinstance(self.proposer, MtpProposer)
        for r in self.scheduler.running:
            r.spec_token_ids.clear()
            r.spec_tree.clear()

    def _free_all_drafts(self) -> None:
        if isinstance(self.proposer, DraftModelProposer):
            for rid in list(self.proposer.computed):
                self.proposer.free(rid)

    def _make_draft(self, target_loaded) -> DraftModelProposer:
        cfg = self.config
        loaded = load_model(cfg.draft_model) if cfg.draft_model else target_loaded
        if loaded.config.vocab_size != self.model_config.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({loaded.config.vocab_size}) differs from the "
                             f"target's ({self.model_config.vocab_size}); they must share a tokenizer")
        mc = loaded.config
        model = LlamaForCausalLM(mc, max_positions=mc.max_position_embeddings)
        model.load_weights(loaded.state_dict)
        model = model.to(device=self.device, dtype=self.dtype).eval()
        model.rotary.cos, model.rotary.sin = model.rotary.cos.float(), model.rotary.sin.float()
        bits = cfg.draft_quant_bits or (16 if cfg.draft_model else 4)  # self-draft defaults to 4 bits
        if bits != 16:
            swap_modules(model, quantize_model(model, original_weights(model), bits, cfg.quant_group_size))
        pack_linears(model, cfg.pack_weights)  # (a quantized draft keeps only its lm_head packed)
        proposer = DraftModelProposer(model, mc, self.block_manager.num_blocks, cfg.block_size, self.device,
                                      self.dtype)
        proposer.runner.fused_decode = self.runner.fused_decode
        if native_decode_applies(mc, self.device, self.dtype):  # the draft may have other head shapes
            proposer.runner.native_decode = self.runner.native_decode
        return proposer

    def _make_mtp(self, loaded) -> MtpProposer:
        path = self.config.mtp_heads or heads_path(loaded.path)
        if not path or not Path(path).exists():
            raise ValueError(f"spec_method 'mtp' needs prediction heads trained for this model, and there are "
                             f"none at {path}: run `inferlab train-mtp --model {self.config.model}` (a few "
                             f"minutes on the CPU), or pass EngineConfig(mtp_heads=...)")
        heads, meta = load_heads(Path(path), self.model_config.hidden_size)
        heads = heads.to(device=self.device, dtype=self.dtype).eval()
        return MtpProposer(heads, self.model, tuple(self.config.mtp_tree_widths), meta)

    def _propose_mtp(self, want: dict) -> None:
        ready = [(r, kr) for r, kr in want.values() if r.mtp_hidden is not None]
        if not ready:
            return
        hidden = torch.stack([r.mtp_hidden for r, _ in ready])
        depths = [min(kr, self.proposer.heads.num_heads) for _, kr in ready]
        # Many requests verifying at once make the step compute-bound: share a budget of tree rows.
        max_nodes = max(max(depths), self.config.mtp_max_tree_tokens // len(ready))
        last = [r.token_slice(r.num_tokens - 1, r.num_tokens)[0] for r, _ in ready]
        for (r, _), (tokens, parents) in zip(ready, self.proposer.propose_batch(hidden, depths, max_nodes, last)):
            r.spec_token_ids, r.spec_tree = tokens, list(parents)

    def _propose(self) -> None:
        k = min(self.config.num_speculative_tokens, MAX_DRAFT)
        if self.proposer is None or k <= 0:
            return
        want = {}
        for r in self.scheduler.running:
            if r.num_tokens - r.num_computed_tokens == 1:
                room = min(r.sampling_params.max_tokens - r.num_output_tokens, self.max_model_len - r.num_tokens) - 1
                if room > 0:
                    want[r.request_id] = (r, min(k, room))
        if isinstance(self.proposer, MtpProposer):
            self._propose_mtp(want)
        elif isinstance(self.proposer, NgramProposer):
            for r, kr in want.values():
                r.spec_token_ids = self.proposer.propose(r.all_token_ids, kr)
        elif want:
            drafts = self.proposer.propose_batch([r for r, _ in want.values()], k)
            for rid, tokens in drafts.items():
                r, kr = want[rid]
                r.spec_token_ids = tokens[:kr]

    def _apply_verify(self, s, logits: torch.Tensor, outputs: dict, finished: list,
                      hidden: torch.Tensor | None = None) -> None:
        req = s.request
        draft = list(req.spec_token_ids)
        req.spec_token_ids.clear()
        if req.spec_tree:
            parents = req.spec_tree[: len(draft)]
            req.spec_tree = []
            res = verify_tree(draft, parents, logits, req.sampling_params, req.generator)
            self._keep_tree_path(req, res.path)
            if hidden is not None:  # the row that produced the corrected or bonus token
                req.mtp_hidden = hidden[res.path[-1] if res.path else 0]
            drafted = max(tree_depths(parents))
        else:
            res = verify(draft, logits, req.sampling_params, req.generator)
            drafted = len(draft)
        req.num_computed_tokens += 1 + res.num_accepted  # the last token and the accepted drafts
        text, new_ids, sources = "", [], []
        for tok, src in zip(res.tokens, res.sources):
            text += append_token(req, tok, self.eos_token_ids, self.max_model_len)
            new_ids.append(tok)
            sources.append(src)
            if req.is_finished:
                break
        self._counts["generated"] += len(new_ids)
        self._count_spec(drafted, res.num_accepted, len(new_ids))
        if isinstance(self.proposer, DraftModelProposer):
            self.proposer.rollback(req.request_id, req.num_computed_tokens)
        if not req.is_finished:
            self.block_manager.truncate(req.request_id, req.num_tokens)  # blocks of rejected drafts
        self.block_manager.commit(req.request_id, req.all_token_ids, req.num_computed_tokens)
        outputs[req.request_id] = make_output(req, new_ids, text, None, self.tokenizer.id_to_piece, sources)
        if req.is_finished:
            self._finish(req, req.status)
            finished.append(req)

    def _keep_tree_path(self, req, path: list[int]) -> None:
        """The accepted path's K/V were written at the slots of their tree rows; move them to the
        positions they now hold (row path[j] -> the position after the last known token + j)."""
        bs = self.config.block_size
        table = self.block_manager.block_table(req.request_id)
        start = req.num_computed_tokens  # the last known token's position (tree row 0)

        def slot(pos: int) -> int:
            return table[pos // bs] * bs + pos % bs

        self.runner.move_slots([(slot(start + row), slot(start + 1 + j))
                                for j, row in enumerate(path) if row != j + 1])

    def _count_spec(self, drafted: int, accepted: int, emitted: int) -> None:
        t = self.spec_totals
        t["draft"] += drafted
        t["accepted"] += accepted
        t["emitted"] += emitted
        t["verify"] += 1
        st = self._step_spec
        st["draft"] += drafted
        st["accepted"] += accepted
        st["emitted"] += emitted
        st["verify"] += 1
        for i in range(drafted):
            self.spec_drafted_per_pos[i] += 1
            st["drafted_pos"][i] += 1
            if i < accepted:
                self.spec_accepted_per_pos[i] += 1
                st["accepted_pos"][i] += 1

    def _begin_spec_step(self) -> None:
        self._step_spec = dict(draft=0, accepted=0, emitted=0, verify=0, drafted_pos=[0] * MAX_DRAFT,
                               accepted_pos=[0] * MAX_DRAFT)

    def _spec_event(self, step: int) -> SpecDecodeStats | None:
        if self.proposer is None:
            return None
        st = self._step_spec
        k = max(1, self.config.num_speculative_tokens)
        alpha = self.spec_totals["accepted"] / self.spec_totals["draft"] if self.spec_totals["draft"] else 0.0
        # Predicted tokens per verify pass for an acceptance rate alpha and draft length k (Leviathan
        # et al.), ignoring the proposer's own cost: (1 - alpha^(k+1)) / (1 - alpha).
        predicted = (1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1.0
        return SpecDecodeStats(step=step, method=self.proposer.name, num_draft_tokens=st["draft"],
                               num_accepted_tokens=st["accepted"], num_emitted_tokens=st["emitted"],
                               num_verify_passes=st["verify"],
                               accepted_per_position=tuple(st["accepted_pos"][:k]),
                               drafted_per_position=tuple(st["drafted_pos"][:k]),
                               predicted_speedup=predicted)

    def _free_spec(self, request_id: str) -> None:
        if isinstance(self.proposer, DraftModelProposer):
            self.proposer.free(request_id)
