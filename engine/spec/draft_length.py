"""How many tokens to draft this step: the length with the most expected tokens per second (goodput, as
SmartSpec picks it for vLLM: Liu et al. 2024, "Optimizing Speculative Decoding for Serving LLMs Using
Goodput"), from what this engine measured itself: how long its decode and verify steps take by their
number of rows, and how often each draft position is accepted.

A verify of k drafts for each of n requests is a step of n * (1 + k) rows. Whether that pays depends on
the machine: where reading the weights dominates (a GPU, a kernel whose extra rows are nearly free) a long
draft pays at a modest acceptance; on a CPU whose several-row step costs two or three one-row steps, or
whose rows spill into a second native call that reads every weight again (engine/runner/fused.py), only
drafts that are accepted often do. A fixed k can make speculation slower than plain decoding; this picks

    k = argmax over 0 <= k <= the configured k of   n * E[tokens per request](k) / cost(n * (1 + k))
    E[tokens per request](k) = 1 + sum over i < k of P(the first i + 1 drafts are all accepted)

k = 0 decodes plainly. A row count never measured is read off the line through the measured ones of as
many requests (once there are two; before, it is taken to cost what a smaller measured one does), and
one with no smaller one measured is tried at once (a step is never cheaper with more rows, so an
unmeasured length that may pay gets tried, then its own measurement counts); a position
never drafted is taken to be accepted as often as the one before it. Every `explore_every`-th choice
drafts one token more than the best, every other such one one less, so the lengths beside the choice
stay measured while the text changes.
"""
from __future__ import annotations

import statistics
from collections import deque

MAX_DRAFT = 8  # draft tokens per request and step, at most (also the most MTP heads a model may have)
COST_SAMPLES = 5  # a step shape's cost: the median of its latest this many times (one slow step - a
# collection, another process - must not price a shape out for good)
ACCEPT_DECAY = 0.98  # per verify: older acceptance counts fade, so the choice follows the text
EXPLORE_EVERY = 16
PRIOR_COUNT = 2.0  # pseudo-verifies behind each position's acceptance estimate (see DraftLength.acceptance)


class DraftLength:
    """The measured step costs and acceptance, and the draft length they favour. Pure bookkeeping (no
    torch): the speculative decoder feeds it and asks it (engine/spec/decoder.py)."""

    def __init__(self, max_draft: int, explore_every: int = EXPLORE_EVERY) -> None:
        # (requests, rows) of a decode/verify step -> the median of its latest times. By requests too: a lone
        # request's 2-row verify (its proposal and verify work included) is not two requests' plain decode
        self.step_s: dict[tuple[int, int], float] = {}
        self._samples: dict[tuple[int, int], deque[float]] = {}
        self.accepted = [0.0] * max_draft  # decayed count of verifies whose drafts 0..i were all accepted
        self.drafted = [0.0] * max_draft  # decayed count of verifies that drafted position i
        self.explore_every = explore_every
        self.choices = 0
        self.last: int | None = None  # the length chosen for the latest step (shown on the spec panel)
        # proposers that say how sure they are (MTP heads): decayed sums of the predicted chance of each
        # drafted position being accepted, and of the positions accepted, to calibrate the prediction
        self.predicted, self.confirmed = 0.0, 0.0

    def observe_step(self, requests: int, rows: int, seconds: float) -> None:
        """A step of only decodes and verifies (no prompt rows), proposal included, took `seconds`."""
        key = (requests, rows)
        if key not in self._samples:  # a shape's first step pays one-time costs (buffers, a plan): not counted
            self._samples[key] = deque(maxlen=COST_SAMPLES)
            return
        self._samples[key].append(seconds)
        self.step_s[key] = statistics.median(self._samples[key])

    def observe_verify(self, drafted: int, accepted: int) -> None:
        self.accepted = [a * ACCEPT_DECAY for a in self.accepted]
        self.drafted = [d * ACCEPT_DECAY for d in self.drafted]
        for i in range(min(drafted, len(self.drafted))):
            self.drafted[i] += 1.0
            if i < accepted:
                self.accepted[i] += 1.0

    def forget_acceptance(self) -> None:
        self.accepted = [0.0] * len(self.accepted)
        self.drafted = [0.0] * len(self.drafted)

    def acceptance(self) -> list[float]:
        """P(drafts 0..i all accepted | position i drafted), per position: the measured rate with PRIOR_COUNT
        pseudo-verifies at the rate of the position before (so one unlucky rejection of a rarely drafted
        position does not rule it out for good; unmeasured: the one before's), never above that one's."""
        rates, previous = [], 1.0
        for a, d in zip(self.accepted, self.drafted):
            previous = min(previous, (a + PRIOR_COUNT * previous) / (d + PRIOR_COUNT))
            rates.append(previous)
        return rates

    def cost(self, requests: int, rows: int) -> float | None:
        """Seconds of a step of `requests` requests in `rows` rows: measured; else, once two shapes of as
        many requests are, read off the straight line through them (least squares, never falling with
        rows; never below a smaller measured one's); else the most a smaller measured one costs (None: none).
        The line spares a short run trying every length once (each new shape's first step is not counted,
        so trying one costs two steps): on a CPU a step's cost grows about linearly with its rows."""
        if (requests, rows) in self.step_s:
            return self.step_s[(requests, rows)]
        same = {r: s for (n, r), s in self.step_s.items() if n == requests}
        smaller = [s for r, s in same.items() if r < rows]
        if not smaller:
            return None
        if len(same) < 2:
            return max(smaller)
        slope, intercept = statistics.linear_regression(list(same), list(same.values()))
        if slope < 0:  # never falling with rows: the mean cost
            slope, intercept = 0.0, statistics.fmean(same.values())
        return max(max(smaller), intercept + slope * rows)

    def choose(self, num_requests: int, max_k: int) -> int:
        """The draft length for a step in which `num_requests` requests decode, at most `max_k`."""
        max_k = min(max_k, len(self.drafted))
        if num_requests <= 0 or max_k <= 0:
            return max(0, max_k)
        rates = self.acceptance()
        best, best_rate = max_k, -1.0
        for k in range(max_k + 1):
            seconds = self.cost(num_requests, num_requests * (1 + k))
            if seconds is None:  # no step this small measured yet: try this length
                best = k
                break
            rate = num_requests * (1 + sum(rates[:k])) / max(seconds, 1e-9)
            if rate > best_rate:
                best, best_rate = k, rate
        best = self._explore(best, max_k)
        self.last = best
        return best

    def _explore(self, best: int, most: int) -> int:
        """Every explore_every-th choice one more than the best, every other such one less, so the costs and
        acceptance on both sides of the choice stay measured (the plain step's too)."""
        self.choices += 1
        if not self.explore_every or self.choices % self.explore_every:
            return best
        up = (self.choices // self.explore_every) % 2 == 1
        return min(best + 1, most) if up or best == 0 else best - 1

    def observe_confident_verify(self, predicted: list[float], accepted: int) -> None:
        """A verify of drafts whose predicted chances of acceptance (each position's, the chain's so far)
        were `predicted`: `accepted` of them were."""
        self.predicted = self.predicted * ACCEPT_DECAY + sum(predicted)
        self.confirmed = self.confirmed * ACCEPT_DECAY + accepted

    def calibration(self) -> float:
        """Measured accepted per predicted acceptance (1 until measured; a prior of a few positions)."""
        return (self.confirmed + 2.0) / (self.predicted + 2.0)

    def worth_proposing(self, num_rows: int) -> bool:
        """Whether even one draft certain to be accepted could pay in a step of `num_rows` rows: (rows + 1)
        tokens for the measured cost of rows + 1 against rows for rows' (True where either is unmeasured, and
        on every explore_every-th step). Where it cannot, the heads need not run at all (on this CPU a
        one-row step costs well under half a two-row one, so a lone stream never drafts)."""
        plain, more = self.step_s.get((num_rows, num_rows)), self.step_s.get((num_rows, num_rows + 1))
        if plain is None or more is None:
            return True
        if self.explore_every and (self.choices + 1) % self.explore_every == 0:
            return True
        if (num_rows + 1) / more > num_rows / plain:
            return True
        self.choices += 1
        self.last = 0
        return False

    def choose_drafts(self, chances: list[list[float]], num_rows: int | None = None) -> list[int]:
        """Drafts per request, for proposers that give each draft position its chance of being accepted
        with the ones before it (non-increasing along a request's chain; calibrated here by what was
        measured). The most likely positions of all requests are taken first, as many as maximise
        expected tokens / measured step cost: a request whose guess is unsure drafts nothing, a sure
        one drafts, in the same step. `num_rows`: the step's rows without drafts (requests decoding; default
        one per request here)."""
        scale = self.calibration()
        ranked = sorted(((min(1.0, c * scale), i, r) for r, cs in enumerate(chances) for i, c in enumerate(cs)),
                        key=lambda x: (-x[0], x[1]))
        n = len(chances) if num_rows is None else num_rows
        best, best_rate, expected = 0, -1.0, float(n)
        for m in range(len(ranked) + 1):
            if m:
                expected += ranked[m - 1][0]
            seconds = self.cost(n, n + m)
            if seconds is None:  # no step this small measured yet: try it
                best = m
                break
            rate = expected / max(seconds, 1e-9)
            if rate > best_rate:
                best, best_rate = m, rate
        best = self._explore(best, len(ranked))
        counts = [0] * len(chances)
        for _, _, r in ranked[:best]:
            counts[r] += 1
        self.last = max(counts, default=0)
        return counts
