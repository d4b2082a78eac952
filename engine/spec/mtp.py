"""Multi-token prediction: Medusa-style heads on the target model propose a tree of drafts.

Head k (k = 1..K) reads the final hidden state h_t that produced token t+1, and the embedding of that
token, and guesses token t+1+k:

    logits_k = lm_head(h_t + SiLU(W_k [h_t ; emb(x_{t+1})] + b_k))

one residual block per head in front of the model's own (frozen, shared) lm_head, so a head costs
2·hidden² weights instead of a vocabulary-sized matrix. Sequential heads (`train-mtp --sequential`)
chain instead: head k reads head k-1's output and the token head k-1 drafted (MtpHeads.step).
W_k starts at zero: an untrained head repeats the model's next-token guess. (Plain Medusa heads, without
the token, load too.) The heads are trained by `inferlab train-mtp` on text the model writes itself
(engine/spec/mtp_train.py) and saved as safetensors.

Each step, a request's candidates form a tree: the top widths[0] tokens of head 1, under each of them
the top widths[1] of head 2, and so on, `depth` levels deep. The target verifies the whole tree in one
pass with a tree attention mask (engine/models/layers/attention.py) and keeps the longest path it agrees with
(engine/spec/verify.py, verify_tree).
"""
from __future__ import annotations

import hashlib
import json
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine import files
from engine.events import SpecMethod
from engine.models.layers.linear import STREAM_MAX_ROWS

DEFAULT_TREE_WIDTHS = (3, 2, 1, 1, 1, 1, 1, 1)
DRAFT_VOCAB = "draft_vocab"  # the heads file's tensor of draft token ids (MtpHeads.draft_vocab)


class MtpHeads(nn.Module):
    """With `use_token`, each head also reads the embedding of token t+1, the token h_t just produced
    (known when the heads run): [h_t ; emb(x_{t+1})] -> hidden. Without it a head has to guess token t+2
    without knowing t+1 (plain Medusa); with it, it only has to do what the model's next pass would."""

    def __init__(self, hidden_size: int, num_heads: int, use_token: bool = True, rank: int | None = None,
                 sequential: bool = False) -> None:
        """rank: each head's matrix as a product (hidden x rank)(rank x width) instead of a full one
        (fewer weights to fit: they generalize better from a few thousand answers).
        sequential: head k (k >= 2) reads head k-1's output and token t+k, the one head k-1 drafted,
        instead of h_t and token t+1 (like Hydra's heads, Ankner et al. 2024): a chain's head k is only
        checked when the drafts before it were right, so it may lean on them."""
        super().__init__()
        if sequential and not use_token:
            raise ValueError("sequential heads read the token before theirs: they need use_token")
        self.use_token, self.rank, self.sequential = use_token, rank, sequential
        width = 2 * hidden_size if use_token else hidden_size
        if rank:
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, rank, bias=False), nn.Linear(rank, hidden_size))
                                        for _ in range(num_heads))
        else:
            self.blocks = nn.ModuleList(nn.Linear(width, hidden_size) for _ in range(num_heads))
        for b in self.blocks:
            out = b[-1] if rank else b  # the last layer starts at zero (a low-rank head's first one cannot)
            nn.init.zeros_(out.weight)
            nn.init.zeros_(out.bias)
        # the token ids the heads draft from (sorted; None: the whole vocabulary): those the training answers
        # use, the softmax they were trained over. Ranking only these reads a few thousand rows of the lm_head
        # instead of all of them (FR-Spec, Zhao et al. 2025): the whole lm_head cost a proposal as much as a
        # third of a decode step on the CPU. A token outside is never drafted; the verify decides as always.
        self.draft_vocab: torch.Tensor | None = None

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def forward(self, hidden: torch.Tensor, token_emb: torch.Tensor | None = None,
                num_heads: int | None = None, before: torch.Tensor | None = None) -> torch.Tensor:
        """hidden (n, hidden) [+ token_emb (n, hidden)] -> (n, heads, hidden), what each head hands the
        lm_head. Sequential heads also take `before` (n, heads - 1, hidden): the embeddings of tokens
        t+2 … t+heads, which heads 2 … read (training: the true ones; proposing: MtpProposer drafts them)."""
        blocks = self.blocks[: num_heads or self.num_heads]
        if not self.sequential:
            x = torch.cat([hidden, token_emb], dim=-1) if self.use_token else hidden
            return torch.stack([hidden + F.silu(b(x)) for b in blocks], dim=1)
        if before is None and len(blocks) > 1:
            raise ValueError("sequential heads read the tokens before theirs: pass `before` (MtpProposer drafts them)")
        outs, z, emb = [], hidden, token_emb
        for k in range(len(blocks)):
            if k:
                emb = before[:, k - 1]
            z = self.step(k, z, emb)
            outs.append(z)
        return torch.stack(outs, dim=1)

    def step(self, k: int, z: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """Sequential head k (0-based): z + SiLU(W_k [z ; emb] + b_k), z the output of head k-1 (h_t for
        the first) and emb the embedding of the token after the one z drafted from."""
        return z + F.silu(self.blocks[k](torch.cat([z, emb], dim=-1)))


def heads_path(model_path: str) -> Path:
    """Where `inferlab train-mtp` saves the heads of a model by default (the user cache dir)."""
    from engine.loading.loader import cache_root

    key = hashlib.sha256(str(Path(model_path).resolve()).encode()).hexdigest()[:16]
    return cache_root() / "mtp" / key / "heads.safetensors"


SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "mtp"  # heads trained for the built-in model


def find_heads(model_path: str, explicit: str | None = None) -> Path | None:
    """The heads this model uses: the ones asked for, else the ones `inferlab train-mtp` saved in the
    user cache, else the ones shipped in assets/mtp/ for a converted GGUF (named by the folder, which is
    the GGUF's content hash, so the same file on every machine); None when there are none."""
    if explicit:
        return Path(explicit) if Path(explicit).exists() else None
    trained = heads_path(model_path)
    if trained.exists():
        return trained
    shipped = SHIPPED / f"{Path(model_path).name}.safetensors"
    return shipped if shipped.exists() else None


def save_heads(heads: MtpHeads, path: Path, meta: dict) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().float().cpu().contiguous() for k, v in heads.state_dict().items()}
    if heads.draft_vocab is not None:
        state[DRAFT_VOCAB] = heads.draft_vocab.detach().long().cpu().contiguous()
    save_file(state, str(path), metadata={"inferlab_mtp": json.dumps(meta)})


def load_heads(path: Path, hidden_size: int, vocab_size: int | None = None,
               min_draft_vocab: int = 1) -> tuple[MtpHeads, dict]:
    """The heads in `path` for a model of `hidden_size` (and `vocab_size`): ValueError naming the file where
    it is not such heads (cut short, of another model, edited): its draft vocabulary must be token ids of
    this model, at least `min_draft_vocab` of them (the tree's widest level), its weights finite. A draft
    id out of range failed only at the first proposal, inside a step, and a metadata error raised from
    deep inside the reader."""
    try:
        return _read_heads(path, hidden_size, vocab_size, min_draft_vocab)
    except ValueError as e:
        raise ValueError(f"{path}: not MTP heads this engine can use ({e}); train them again with "
                         f"`inferlab train-mtp`") from e
    except Exception as e:  # noqa: BLE001 (safetensors' own error type, torch's load_state_dict)
        raise ValueError(f"{path}: not readable MTP heads ({type(e).__name__}: {str(e)[:200]}); cut short or "
                         f"of another version? Train them again with `inferlab train-mtp`") from e


def _read_heads(path: Path, hidden_size: int, vocab_size: int | None, min_draft_vocab: int) -> tuple[MtpHeads, dict]:
    from safetensors import safe_open

    files.check_regular(path)  # (safetensors would wait for ever on a FIFO)
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads((f.metadata() or {}).get("inferlab_mtp", "{}"))
        state = {k: f.get_tensor(k) for k in f.keys()}
    if not isinstance(meta, dict):
        raise ValueError("its metadata is not a JSON object")
    vocab = state.pop(DRAFT_VOCAB, None)
    if vocab is not None:
        if vocab.dim() != 1 or vocab.is_floating_point() or vocab.is_complex() or vocab.numel() < min_draft_vocab:
            raise ValueError(f"its draft vocabulary is not a list of at least {min_draft_vocab} token ids")
        if vocab.numel() and (int(vocab.min()) < 0 or (vocab_size is not None and int(vocab.max()) >= vocab_size)):
            raise ValueError(f"its draft vocabulary holds ids outside this model's {vocab_size} tokens")
    if not all(t.is_floating_point() and bool(torch.isfinite(t).all()) for t in state.values()):
        raise ValueError("weights that are not finite numbers")
    num = len({k.split(".")[1] for k in state if k.startswith("blocks.")})
    rank = state["blocks.0.0.weight"].shape[0] if "blocks.0.0.weight" in state else None
    if rank:  # low rank: (rank, width) then (hidden, rank)
        shape = (state["blocks.0.1.weight"].shape[0], state["blocks.0.0.weight"].shape[1])
    else:
        shape = tuple(state["blocks.0.weight"].shape) if "blocks.0.weight" in state else ()
    if not num or shape not in ((hidden_size, hidden_size), (hidden_size, 2 * hidden_size)):
        raise ValueError(f"no MTP heads for a hidden size of {hidden_size}")
    heads = MtpHeads(hidden_size, num, use_token=shape[1] == 2 * hidden_size, rank=rank,
                     sequential=bool(meta.get("sequential")))
    heads.load_state_dict(state)
    heads.draft_vocab = None if vocab is None else vocab.long()
    return heads, meta


def tree_nodes(widths: tuple[int, ...], depth: int) -> list[tuple[int, ...]]:
    """Every node of the candidate tree as the tuple of candidate ranks on its path, parents first
    (breadth first): widths (3, 2), depth 2 -> (0,) (1,) (2,) (0, 0) (0, 1) (1, 0) …"""
    level: list[tuple[int, ...]] = [()]
    nodes: list[tuple[int, ...]] = []
    for d in range(depth):
        width = widths[d] if d < len(widths) else 1
        level = [node + (r,) for node in level for r in range(width)]
        nodes.extend(level)
    return nodes


def head_logits(lm_head: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    """lm_head over 2-D rows (n * depth, hidden), at most STREAM_MAX_ROWS per call: the path a decode
    step's rows take (the weight-streaming kernel reads the vocabulary-sized weight once per call). A 3-D
    input missed that kernel; on a CPU without native bf16 it widened the whole lm_head to fp32 on every
    proposal (2/3 of an MTP step's time as AVX2, 2 streams x 3 heads)."""
    return torch.cat([lm_head(part) for part in rows.split(STREAM_MAX_ROWS)])


class MtpProposer:
    """Proposes a tree of drafts per request from its last hidden state."""

    name = SpecMethod.MTP

    def __init__(self, heads: MtpHeads, model: nn.Module, widths: tuple[int, ...] = DEFAULT_TREE_WIDTHS,
                 meta: dict | None = None) -> None:
        # the model's lm_head and embedding table are looked up at each call: requantizing swaps them
        self.heads, self.model, self.widths = heads, model, widths
        self.meta = meta or {}
        self._trees: dict[tuple[int, int | None], tuple[list[tuple[int, ...]], list[int]]] = {}
        # (a weak reference to the lm_head they came from, draft ids, their rows): not keeping a swapped one alive
        self._draft_rows: tuple[weakref.ref, torch.Tensor, torch.Tensor] | None = None
        self._packed: tuple[torch.Tensor, torch.Tensor] | None = None  # _packed_heads()

    def tree(self, depth: int, max_nodes: int | None = None) -> tuple[list[tuple[int, ...]], list[int]]:
        """(nodes, parent row of each node) for a tree `depth` levels deep, most likely nodes first: by
        the sum of their candidate ranks, then depth (so the top-1 chain leads and a parent always comes
        before its children), cut to `max_nodes` when the step has many requests to verify."""
        key = (depth, max_nodes)
        if key not in self._trees:
            nodes = sorted(tree_nodes(self.widths, depth), key=lambda n: (sum(n), len(n), n))[:max_nodes]
            row = {node: i + 1 for i, node in enumerate(nodes)}
            self._trees[key] = (nodes, [row.get(node[:-1], 0) for node in nodes])
        return self._trees[key]

    @torch.inference_mode()
    def propose_batch(self, hidden: torch.Tensor, depths: list[int], max_nodes: int | None = None,
                      last_tokens: list[int] | None = None, chain: bool = False) -> list[tuple[list[int], list[int]]]:
        """hidden (n, hidden) for n requests (and the tokens they produced) -> per request (draft
        tokens, parent rows). `chain`: each request's top-1 chain only, as deep as its depth."""
        depth = max(depths)
        width = max(self.widths[:depth]) if depth else 1
        logits, ids = self._logits(hidden, depth, last_tokens)
        top = logits.topk(width, dim=-1).indices
        top = (top if ids is None else ids[top]).tolist()  # (n, depth, width) token ids
        result = []
        for i, d in enumerate(depths):
            nodes, parents = self.tree(d, d if chain else max_nodes)  # the top-1 chain leads the order
            result.append(([top[i][len(node) - 1][node[-1]] for node in nodes], parents))
        return result

    @torch.inference_mode()
    def propose_chains(self, hidden: torch.Tensor, depths: list[int],
                       last_tokens: list[int] | None = None) -> list[tuple[list[int], list[float]]]:
        """Each request's top-1 chain, as deep as its depth, with each position's predicted chance of
        being accepted together with the ones before it: the product of the heads' top-1 probabilities
        along the chain (the draft length is then chosen per request from these, engine/spec/draft_length.py;
        a head's top-1 probability separates likely drafts from unlikely ones well here: on the
        multi-token chapter's text head 1 was right 0 % of the time below 0.2 and ~70 % above 0.6)."""
        logits, ids = self._logits(hidden, max(depths), last_tokens)
        prob, top = logits.float().softmax(-1).max(-1)  # (n, depth)
        top = top if ids is None else ids[top]
        chance = prob.cumprod(-1)
        return [(top[i, :d].tolist(), chance[i, :d].tolist()) for i, d in enumerate(depths)]

    def _logits(self, hidden: torch.Tensor, depth: int,
                last_tokens: list[int] | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(each head's logits (n, depth, V), the token ids of those V columns or None for the whole
        vocabulary)."""
        stream = self._stream(hidden)
        if self.heads.sequential:
            return self._sequential_logits(stream, hidden, depth, last_tokens)
        if stream is not None:
            return self._streamed_logits(stream, hidden, depth, last_tokens)
        dtype = next(self.heads.parameters()).dtype  # float32 on the CPU (see SpeculativeDecoder._make_mtp)
        emb = None
        if self.heads.use_token:
            emb = self.model.embed_tokens(torch.tensor(last_tokens, device=hidden.device)).to(dtype)
        out = self.heads(hidden.to(dtype), emb, depth)  # (n, depth, hidden)
        logits, ids = self._rank(out.flatten(0, 1), hidden.dtype)
        return logits.unflatten(0, out.shape[:2]), ids

    def _rank(self, rows: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits of what the heads hand the lm_head (m, hidden), their token ids or None): over the draft
        vocabulary's float32 rows where there is one, else the whole lm_head on rows of `dtype`."""
        draft = self._draft_vocab_rows()
        if draft is not None:  # rank the draft vocabulary only
            ids, weight = draft
            return F.linear(rows.to(weight.dtype), weight), ids
        return head_logits(self.model.lm_head, rows.to(dtype)), None

    def _sequential_logits(self, stream, hidden: torch.Tensor, depth: int,
                           last_tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """_logits for sequential heads, head by head: each ranks, its top-1 is its draft, and the next
        head reads that token (a chain; a tree's deeper levels rank under the top-1 path, as
        independent heads' do). Through the native kernel (`stream`) where _stream allows it."""
        n, size = hidden.shape
        tokens = torch.tensor(last_tokens, device=hidden.device)
        dtype = next(self.heads.parameters()).dtype
        z = hidden.float() if stream is not None else hidden.to(dtype)
        per_head, ids = [], None
        weight, bias = self._packed_heads() if stream is not None else (None, None)
        for k in range(depth):
            emb = self.model.embed_tokens(tokens)
            if stream is not None:
                x = torch.cat([z.to(torch.bfloat16), emb.to(torch.bfloat16)], dim=-1)
                z = z + F.silu(_stream_rows(stream, x, weight[k * size : (k + 1) * size],
                                            bias[k * size : (k + 1) * size]).float())
                logits, ids = self._stream_rank(stream, z)
            else:
                z = self.heads.step(k, z, emb.to(dtype))
                logits, ids = self._rank(z, hidden.dtype)
            per_head.append(logits)
            top = logits.argmax(-1)
            tokens = top if ids is None else ids[top]
        return torch.stack(per_head, dim=1), ids

    def _stream(self, hidden: torch.Tensor):
        """The native weight-streaming module when this proposal can take it: bf16 rows on the CPU, full-rank
        heads with a draft vocabulary, and an lm_head with a bf16 weight and the module attached (the
        engine's kernels, once built); else None (the heads' own float32 products)."""
        stream = getattr(self.model.lm_head, "stream", None)
        weight = getattr(self.model.lm_head, "weight", None)
        if (stream is None or hidden.dtype != torch.bfloat16 or hidden.device.type != "cpu" or self.heads.rank
                or self.heads.draft_vocab is None or not isinstance(weight, torch.Tensor)
                or weight.dtype != torch.bfloat16):
            return None
        return stream

    def _streamed_logits(self, stream, hidden: torch.Tensor, depth: int,
                         last_tokens: list[int] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """_logits through the native streaming kernel: every head in one product, then the draft
        vocabulary's rows in another, both over bf16 weights (at most STREAM_MAX_ROWS rows a call). On the
        CPU a proposal's cost is reading those weights: the float32 products read twice the bytes, and
        one call per head (in the engine, 2 streams, 1 thread: a proposal took 2.5 ms with one head before,
        1.0-1.5 ms with three now, ~0.5 ms of it the two products). The heads' sums are float32 as before;
        their weights are rounded to bf16, which may change a near-tied draft (a draft is only a guess: the
        verify decides every token)."""
        n, size = hidden.shape
        weight, bias = self._packed_heads()
        x = hidden
        if self.heads.use_token:
            emb = self.model.embed_tokens(torch.tensor(last_tokens, device=hidden.device))
            x = torch.cat([hidden, emb.to(torch.bfloat16)], dim=-1)
        y = _stream_rows(stream, x, weight[: depth * size], bias[: depth * size]).view(n, depth, size)
        out = hidden.float().unsqueeze(1) + F.silu(y.float())  # (n, depth, hidden)
        logits, ids = self._stream_rank(stream, out.flatten(0, 1))
        return logits.unflatten(0, (n, depth)), ids

    def _stream_rank(self, stream, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """_rank through the native kernel: the draft vocabulary's bf16 rows against `rows` (m, hidden)."""
        ids, weight = self._draft_vocab_rows(torch.bfloat16)
        return _stream_rows(stream, rows.to(torch.bfloat16), weight, None), ids

    def _packed_heads(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every head's matrix stacked, (heads * hidden, width) bf16, and their biases (heads * hidden,) float32:
        the first `depth` heads are the first depth * hidden rows."""
        if self._packed is None:
            blocks = list(self.heads.blocks)
            weight = torch.cat([b.weight.detach() for b in blocks]).to(torch.bfloat16).contiguous()
            self._packed = (weight, torch.cat([b.bias.detach() for b in blocks]).float().contiguous())
        return self._packed

    def _draft_vocab_rows(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(draft token ids (V',), their lm_head rows (V', hidden) in `dtype`), taken once per lm_head (a
        requantized model has another); None without a draft vocabulary or with an lm_head that has no
        plain weight matrix (a quantized one: the whole lm_head then ranks)."""
        vocab, lm_head = self.heads.draft_vocab, self.model.lm_head
        weight = getattr(lm_head, "weight", None)
        if vocab is None or not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
            return None
        if self._draft_rows is None or self._draft_rows[0]() is not lm_head or self._draft_rows[2].dtype != dtype:
            ids = vocab.to(weight.device)
            self._draft_rows = (weakref.ref(lm_head), ids, weight.detach()[ids].to(dtype).contiguous())
        return self._draft_rows[1], self._draft_rows[2]


def _stream_rows(stream, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T (+ bias) through the native streaming kernel, STREAM_MAX_ROWS rows a call."""
    return torch.cat([stream.stream_linear_bf16(part, weight, bias) for part in x.contiguous().split(STREAM_MAX_ROWS)])
