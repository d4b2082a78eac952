"""Train multi-token prediction heads by self-distillation (`inferlab train-mtp`).

1. The model answers a set of instructions itself (assets/mtp_prompts.txt, 256 of them, through its
   chat template when it has one), three in four greedily and one sampled at temperature 0.7: the text
   the heads must learn to foresee is the text this model writes. With `continuations` (the default) it
   also continues each instruction as plain text, greedily, past where it would stop: the talk's
   workloads are plain text continued that way (their held-out accuracy: 32 -> 38 % for head 1).
   With `self_prompts` N it also writes N openings of its own (a few tokens sampled at temperature 1 from
   the start of a text, so they wander over whatever the model knows: fiction, code, recipes, …) and
   continues each greedily: as much text of its own kind as there is time to write, on no one's prompts.
2. One forward pass per answer gives the final hidden state h_t at every position.
3. Head k learns to predict token t+1+k from h_t (cross-entropy through the frozen lm_head, the softmax
   over the tokens the answers use, at most DRAFT_VOCAB_MAX of them), on the answer positions only;
   sequential heads also read the true tokens t+2 … t+k (teacher forcing). The answers are split 80/10/10:
   training stops once the loss on "val" stops improving (early stopping) and each head's top-1 accuracy
   is reported on "test", which training never saw.
The heads are small (2·hidden² + hidden per head, or a low-rank product) and fit in a few minutes on the
CPU; writing the answers is most of the time.
"""
from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.files import read_json
from engine.sampling_params import SamplingParams
from engine.spec.mtp import MtpHeads, heads_path, save_heads

PROMPTS = Path(__file__).resolve().parents[2] / "assets" / "mtp_prompts.txt"
IGNORE = -100

Progress = Callable[[str, float | None], None]
OPENING_TOKENS = 24  # tokens of a self-written opening (self_prompted)
# at most this many draft tokens (the answers' most frequent): ranking them is most of a proposal's cost
DRAFT_VOCAB_MAX = 4096
MAX_ANSWERS_BYTES = 512 * 2**20  # the kept answers (--prompts x --max-tokens token ids as JSON)
# the heads' rank by default (None: full matrices); chosen by held-out accuracy (docs/measurements/speculative.md)
RANK = None
WEIGHT_DECAY = 0.0


def default_prompts() -> list[str]:
    lines = PROMPTS.read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def written(engine, prompts: Sequence[list[int]], params, progress: Progress | None = None,
            what: str = "answers") -> list:
    """engine.generate, with a progress line each time answers finish ("the model writes its training text:
    37 of 256 chat answers")."""
    if progress is None:
        return engine.generate(prompts, params)
    done = [0]

    def on_step(event) -> None:
        finished = sum(1 for out in event.outputs if out.finished)
        if finished:
            done[0] += finished
            progress(f"the model writes its training text: {done[0]} of {len(prompts)} {what}", None)

    engine.add_listener(on_step)
    try:
        return engine.generate(prompts, params)
    finally:
        engine.remove_listener(on_step)


def self_distill(engine, prompts: Sequence[str | list[int]], max_tokens: int,
                 progress: Progress | None = None) -> list[tuple[list[int], int]]:
    """(prompt + answer token ids, prompt length) for each prompt, answered by the engine itself."""
    tok = engine.tokenizer
    ids = []
    for p in prompts:
        if isinstance(p, str) and tok.has_chat_template:
            p = tok.apply_chat_template([{"role": "user", "content": p}])
        ids.append(tok.encode(p) if isinstance(p, str) else list(p))
    # Mostly greedy (what the heads will be asked to foresee), every fourth answer sampled for variety.
    params = [SamplingParams(max_tokens=max_tokens, temperature=0.7 if i % 4 == 3 else 0.0, seed=i)
              for i in range(len(ids))]
    outs = written(engine, ids, params, progress, "chat answers")
    return [(p + list(o.token_ids), len(p)) for p, o in zip(ids, outs)]


def continue_plainly(engine, prompts: Sequence[str], max_tokens: int,
                     progress: Progress | None = None) -> list[tuple[list[int], int]]:
    """(prompt + continuation token ids, prompt length): the prompts as plain text, no chat template,
    continued greedily for max_tokens whatever the model would stop at - the kind of text the talk's
    workloads have the model write (windows of plain text continued with ignore_eos)."""
    ids = [engine.tokenizer.encode(p) for p in prompts]
    outs = written(engine, ids, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True), progress,
                   "plain continuations")
    return [(p + list(o.token_ids), len(p)) for p, o in zip(ids, outs)]


def self_prompted(engine, count: int, max_tokens: int, opening_tokens: int = OPENING_TOKENS,
                  seed: int = 0, progress: Progress | None = None) -> list[tuple[list[int], int]]:
    """(opening + continuation token ids, opening length) for `count` openings the model writes itself:
    `opening_tokens` sampled at temperature 1 after the start-of-text token (a seed each), then continued
    greedily for max_tokens with ignore_eos. Only the greedy continuation is trained on (the opening is
    the prompt): it is what a verify checks the heads against."""
    tok = engine.tokenizer
    start = [tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id]
    if start[0] is None:
        raise ValueError("self-written openings need a start-of-text (or end-of-text) token; this tokenizer has none")
    openings = written(engine, [start] * count, [SamplingParams(max_tokens=opening_tokens, temperature=1.0,
                                                                 seed=seed * 1_000_003 + i) for i in range(count)],
                       progress, "openings of its own")
    ids = [start + list(o.token_ids) for o in openings]
    outs = written(engine, ids, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True), progress,
                   "continuations of its openings")
    return [(p + list(o.token_ids), len(p)) for p, o in zip(ids, outs)]


HIDDEN_BATCH_TOKENS = 2048  # tokens of answers read in one forward pass (hidden_and_labels)


def _hidden_batches(engine, seqs: Sequence[tuple[list[int], int]]):
    """(index, answer, its hidden states) for every answer, read a few at a time in one forward pass
    (up to HIDDEN_BATCH_TOKENS tokens; 13 answers of 150 tokens: 1.6 s against 1.9 s one at a time, Zen 4,
    2 threads)."""
    start = 0
    while start < len(seqs):
        end, tokens = start, 0
        while end < len(seqs) and (end == start or tokens + len(seqs[end][0]) <= HIDDEN_BATCH_TOKENS):
            tokens += len(seqs[end][0])
            end += 1
        states = engine.hidden_states_many([ids for ids, _ in seqs[start:end]])
        for i, h in zip(range(start, end), states):
            yield i, seqs[i], h
        start = end


def hidden_and_labels(engine, seqs: Sequence[tuple[list[int], int]], num_heads: int,
                      progress: Progress | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h (N, hidden) float32 at every answer position t (from the last prompt token on), the token
    t+1 that h_t produced (N,), and labels (N, heads): token t+1+k for head k (1-based), IGNORE past
    the end. All three on the device the hidden states come from (the engine's): the heads train there."""
    hs, nexts, labels = [], [], []
    for i, (ids, n_prompt), h in _hidden_batches(engine, seqs):
        if progress is not None and i % 32 == 0:
            progress(f"reading the hidden states: {i} of {len(seqs)} answers", None)
        h = h.float()
        t = torch.arange(n_prompt - 1, len(ids) - 1, device=h.device)
        lab = torch.full((len(t), num_heads), IGNORE, dtype=torch.long, device=h.device)
        ids_t = torch.tensor(ids, device=h.device)
        for k in range(1, num_heads + 1):
            ok = t + 1 + k < len(ids)
            lab[ok, k - 1] = ids_t[t[ok] + 1 + k]
        hs.append(h[t])
        nexts.append(ids_t[t + 1])
        labels.append(lab)
    return torch.cat(hs), torch.cat(nexts), torch.cat(labels)


def head_loss(heads: MtpHeads, weights: tuple[torch.Tensor, torch.Tensor], h: torch.Tensor, nxt: torch.Tensor,
              labels: torch.Tensor, vocab: torch.Tensor | None = None):
    """(mean cross-entropy, per-head top-1 hits, per-head counted positions). weights: (lm_head, embedding
    table), 16-bit originals as float32. labels: token ids (N, heads). vocab: the softmax over these token
    ids only (the labels mapped to their rows; one outside is not counted), a shortlist that makes training
    several times cheaper; None: every token. Sequential heads read the true tokens before theirs
    (teacher forcing: a chain's head k only counts when the drafts before it were those tokens)."""
    lm_weight, emb_weight = weights
    before = None
    if heads.sequential:  # head k (k >= 2) reads token t+k: the label of head k - 1
        before = emb_weight[labels[:, :-1].clamp(min=0)]
    logits = heads(h, emb_weight[nxt] if heads.use_token else None, before=before)
    if vocab is not None:
        lm_weight = lm_weight[vocab]
        labels = shortlist_labels(labels, vocab, emb_weight.shape[0])
    logits = logits @ lm_weight.t()  # (n, heads, V)
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
    valid = labels != IGNORE
    hits = ((logits.argmax(-1) == labels) & valid).sum(0)
    return loss, hits, valid.sum(0)


def shortlist(nxt: torch.Tensor, labels: torch.Tensor, max_size: int | None = DRAFT_VOCAB_MAX) -> torch.Tensor:
    """The token ids the training answers use, the `max_size` most frequent of them, sorted: the heads
    learn to rank these and serving drafts only these. A label outside is not counted (head_loss maps the
    labels to their rows, shortlist_labels); a token never drafted is still what the verify may emit."""
    seen, counts = torch.cat([nxt, labels[labels != IGNORE]]).unique(return_counts=True)
    if max_size is not None and len(seen) > max_size:
        seen = seen[counts.argsort(descending=True, stable=True)[:max_size]].sort().values
    return seen


def train_heads(h: torch.Tensor, nxt: torch.Tensor, labels: torch.Tensor, weights: tuple[torch.Tensor, torch.Tensor],
                num_heads: int, *, epochs: int = 3, batch: int = 256, lr: float = 1e-3, seed: int = 0,
                use_token: bool = True, rank: int | None = None, weight_decay: float = 0.0,
                val: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, patience: int = 1,
                full_vocab: bool = False, sequential: bool = False, progress: Progress | None = None) -> MtpHeads:
    """AdamW on the heads, `epochs` passes at most. With `val`, the held-out loss is measured after each
    epoch and training stops once it has not improved for `patience` epochs; the best epoch's heads are
    returned (early stopping). Unless `full_vocab`, the softmax runs over the answers' tokens only."""
    torch.manual_seed(seed)
    heads = MtpHeads(h.shape[1], num_heads, use_token, rank, sequential).to(h.device)  # where the hidden states are
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=weight_decay)
    vocab = None if full_vocab else shortlist(nxt, labels)
    steps = epochs * -(-len(h) // batch)
    done, best, best_state, waited = 0, float("inf"), None, 0
    for epoch in range(epochs):
        order = torch.randperm(len(h)).to(h.device)  # drawn on the CPU: the same order on every device
        for i in range(0, len(h), batch):
            idx = order[i : i + batch]
            loss, _, _ = head_loss(heads, weights, h[idx], nxt[idx], labels[idx], vocab)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
            if progress:
                progress(f"training heads: epoch {epoch + 1}, loss {loss.item():.3f}", done / steps)
        if val is None:
            continue
        val_loss = mean_loss(heads, weights, *val, vocab)
        if progress:
            progress(f"training heads: epoch {epoch + 1}, held-out loss {val_loss:.3f}", done / steps)
        if val_loss < best:
            best, waited = val_loss, 0
            best_state = {k: v.detach().clone() for k, v in heads.state_dict().items()}
        else:
            waited += 1
            if waited >= patience:
                break
    if best_state is not None:
        heads.load_state_dict(best_state)
    heads.draft_vocab = None if vocab is None else vocab.cpu()  # serving drafts from what the softmax covered
    return heads


def shortlist_labels(labels: torch.Tensor, vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Labels mapped to their rows in a shortlist; a token outside it is not counted (IGNORE)."""
    row = torch.full((vocab_size,), IGNORE, dtype=torch.long, device=labels.device)
    row[vocab] = torch.arange(len(vocab), device=labels.device)
    return torch.where(labels == IGNORE, labels, row[labels.clamp(min=0)])


@torch.no_grad()
def evaluate(heads: MtpHeads, weights, h: torch.Tensor, nxt: torch.Tensor, labels: torch.Tensor,
             vocab: torch.Tensor | None = None) -> tuple[float, list[float]]:
    """(mean cross-entropy over the counted positions, top-1 per head), in chunks of 512 positions; over
    the shortlist `vocab` or, None, the whole vocabulary (what serving ranks). labels: token ids."""
    total = 0.0
    hits = torch.zeros(heads.num_heads, dtype=torch.long, device=h.device)
    count = torch.zeros(heads.num_heads, dtype=torch.long, device=h.device)
    for i in range(0, len(h), 512):
        loss, hh, cc = head_loss(heads, weights, h[i : i + 512], nxt[i : i + 512], labels[i : i + 512], vocab)
        n = int(cc.sum())
        if n:  # a chunk with nothing counted has a NaN mean
            total += float(loss) * n
        hits += hh
        count += cc
    return total / max(1, int(count.sum())), [a / max(1, c) for a, c in zip(hits.tolist(), count.tolist())]


def mean_loss(heads: MtpHeads, weights, h: torch.Tensor, nxt: torch.Tensor, labels: torch.Tensor,
              vocab: torch.Tensor | None = None) -> float:
    return evaluate(heads, weights, h, nxt, labels, vocab)[0]


def accuracy(heads: MtpHeads, weights, h: torch.Tensor, nxt: torch.Tensor, labels: torch.Tensor) -> list[float]:
    """Top-1 per head over the whole vocabulary (what serving ranks)."""
    return evaluate(heads, weights, h, nxt, labels)[1]


def split_answers(seqs: list, seed: int = 0) -> dict[str, list]:
    """Answers shuffled, then a tenth held out for early stopping ("val") and a tenth never touched
    while training ("test", what the report's held-out accuracy is measured on)."""
    seqs = list(seqs)
    random.Random(seed).shuffle(seqs)
    if len(seqs) < 3:  # too few answers to hold any out: every split is all of them
        return {"test": seqs, "val": seqs, "train": seqs}
    n = max(1, len(seqs) // 10)
    return {"test": seqs[:n], "val": seqs[n : 2 * n], "train": seqs[2 * n :]}


def training_data(engine, num_heads: int, prompts: Sequence[str | list[int]], max_tokens: int,
                  seed: int = 0, continuations: bool = False, self_prompts: int = 0,
                  progress: Progress | None = None, text: str | Path | None = None) -> dict:
    """The self-distilled examples: train, val and test (h, next token, labels), split by answer.
    `continuations`: also the model's plain continuations of the text prompts (continue_plainly);
    `self_prompts`: also that many openings the model writes itself, continued (self_prompted)."""
    def write() -> list[tuple[list[int], int]]:
        seqs = self_distill(engine, prompts, max_tokens, progress)
        if continuations:
            seqs += continue_plainly(engine, [p for p in prompts if isinstance(p, str)], max_tokens, progress)
        if self_prompts:
            seqs += self_prompted(engine, self_prompts, max_tokens, seed=seed, progress=progress)
        return seqs

    made = dict(model=str(engine.model_path), prompts=[p if isinstance(p, str) else list(p) for p in prompts],
                max_tokens=max_tokens, seed=seed, continuations=continuations, self_prompts=self_prompts)
    seqs = written_text(Path(text), made, write, progress, engine.model_config.vocab_size) if text else write()
    return {name: hidden_and_labels(engine, part, num_heads, progress)
            for name, part in split_answers(seqs, seed).items()}


def written_text(path: Path, made: dict, write: Callable[[], list], progress: Progress | None = None,
                 vocab_size: int | None = None) -> list:
    """The answers kept in `path` (JSON) when they were written the way `made` says (model, prompts, lengths,
    seed), else `write()`'s, kept there: training again with other options (heads, rank, epochs) skips
    the writing, most of train-mtp's time. A file that does not parse, or was written otherwise, is
    written again, with a line saying why."""
    try:
        kept = read_json(path, MAX_ANSWERS_BYTES)
        if kept.get("made") == made:
            seqs = [(list(map(int, ids)), int(n)) for ids, n in kept["answers"]]
            if any(not 0 < n <= len(ids) for ids, n in seqs) or (
                    vocab_size and any(not 0 <= t < vocab_size for ids, _ in seqs for t in ids)):
                raise ValueError("it holds answers this model cannot have written (token ids or lengths out of range)")
            if progress is not None:
                progress(f"reusing the {len(seqs)} answers kept in {path}", None)
            return seqs
        why = "they were written with other settings"
    except FileNotFoundError:
        why = None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        why = f"it could not be read ({type(exc).__name__}: {exc})"
    if why and progress is not None:
        progress(f"writing the answers again: {path} holds none to reuse, {why}", None)
    seqs = write()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"made": made, "answers": seqs}), encoding="utf-8")
    tmp.replace(path)
    return seqs


def original_weights(engine) -> tuple[torch.Tensor, torch.Tensor]:
    """The 16-bit lm_head and embedding table as float32, whatever the engine runs now."""
    return engine.weights.originals["lm_head"].float(), engine.weights.originals["embed_tokens"].float()


def fit_heads(data: dict, weights, num_heads: int, *, epochs: int, lr: float, seed: int = 0,
              use_token: bool = True, rank: int | None = None, weight_decay: float = 0.0, patience: int = 1,
              full_vocab: bool = False, sequential: bool = False,
              progress: Progress | None = None) -> tuple[MtpHeads, dict]:
    """Train (early stopping on "val"), then measure top-1 accuracy per head on the held-out answers
    ("test", untouched by training; "val" too) and on a sample of the training ones, against untrained heads."""
    train, val = data["train"], data["val"]
    test = data.get("test", val)
    weights = tuple(w.to(train[0].device) for w in weights)  # the host's 16-bit originals join the states
    heads = train_heads(*train, weights, num_heads, epochs=epochs, lr=lr, seed=seed, use_token=use_token, rank=rank,
                        weight_decay=weight_decay, val=val, patience=patience, full_vocab=full_vocab,
                        sequential=sequential, progress=progress)
    untrained = MtpHeads(train[0].shape[1], num_heads, use_token, sequential=sequential).to(train[0].device)
    sample = tuple(t[:4096] for t in train)  # how well the heads fit what they saw

    def pct(hs, split):
        return [round(a, 4) for a in accuracy(hs, weights, *split)]

    return heads, dict(train_positions=len(train[0]), val_positions=len(val[0]), test_positions=len(test[0]),
                       test_top1_per_head=pct(heads, test), test_top1_untrained=pct(untrained, test),
                       val_top1_per_head=pct(heads, val), train_top1_per_head=pct(heads, sample),
                       train_top1_untrained=pct(untrained, sample))


def train_mtp(engine, *, num_heads: int = 3, prompts: Sequence[str | list[int]] | None = None,
              max_tokens: int = 128, epochs: int = 8, lr: float = 3e-3, rank: int | None = RANK,
              weight_decay: float = WEIGHT_DECAY, patience: int = 1, out: str | Path | None = None,
              seed: int = 0, use_token: bool = True, continuations: bool = True, self_prompts: int = 0,
              sequential: bool = False, text: str | Path | None = None, progress: Progress | None = None) -> dict:
    """Generate, extract, train (early stopping on held-out answers), measure, save. Returns a report
    (also stored in the file's metadata). `text`: a file that keeps the written answers (written_text)."""
    report = progress or (lambda message, fraction: None)
    t0 = time.perf_counter()
    prompts = list(prompts or default_prompts())
    extra = f" and continues {self_prompts} openings of its own" if self_prompts else ""
    report(f"the model answers {len(prompts)} prompts itself{extra}, then its hidden states are read…", 0.0)
    data = training_data(engine, num_heads, prompts, max_tokens, seed, continuations, self_prompts, report, text)
    t1 = time.perf_counter()
    heads, measured = fit_heads(data, original_weights(engine), num_heads, epochs=epochs, lr=lr, seed=seed,
                                use_token=use_token, rank=rank, weight_decay=weight_decay, patience=patience,
                                sequential=sequential, progress=report)
    path = Path(out) if out else heads_path(engine.model_path)
    meta = dict(model=str(engine.model_path), num_heads=num_heads, reads_last_token=use_token, rank=rank,
                sequential=sequential,
                continuations=continuations, self_prompts=self_prompts,
                draft_vocab=None if heads.draft_vocab is None else len(heads.draft_vocab),
                prompts=len(prompts), max_tokens=max_tokens, epochs=epochs, lr=lr, weight_decay=weight_decay,
                patience=patience, **measured, data_seconds=round(t1 - t0, 1),
                fit_seconds=round(time.perf_counter() - t1, 1), seconds=round(time.perf_counter() - t0, 1))
    save_heads(heads, path, meta)
    report(f"saved {path}", 1.0)
    return dict(meta, path=str(path))
