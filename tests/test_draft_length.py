"""The draft length per step (engine/spec/draft_length.py): the most expected tokens per second from
measured step costs and acceptance, and the engine feeding and following it."""
from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.spec.draft_length import DraftLength

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10, 11, 9], [12, 13, 12, 13, 12]]


def measured(costs: dict[int, float], accepted_in_a_row: list[int], max_draft: int = 8,
             requests: int = 2) -> DraftLength:
    """A DraftLength that saw steps of `requests` requests at these costs (rows -> seconds) and verifies
    of 4 drafts each accepting this many in a row; no exploration."""
    dl = DraftLength(max_draft, explore_every=0)
    for rows, seconds in costs.items():
        dl.observe_step(requests, rows, 1.0)  # a shape's first step is not counted (one-time costs)
        dl.observe_step(requests, rows, seconds)
    for accepted in accepted_in_a_row:
        dl.observe_verify(4, accepted)
    return dl


def test_no_drafts_where_a_verify_costs_more_than_its_accepted_tokens_bring():
    # two requests; every extra row costs as much as a decode row (a compute-bound step); 1 in 4 accepted
    dl = measured({2: 0.030, 4: 0.060, 6: 0.090, 8: 0.120}, [1, 0, 0, 0] * 5)
    assert dl.choose(2, 3) == 0


def test_long_drafts_where_extra_rows_are_nearly_free():
    dl = measured({2: 0.030, 4: 0.031, 6: 0.032, 8: 0.033}, [4, 3, 4, 2] * 5)
    assert dl.choose(2, 3) == 3


def test_a_verify_that_spills_into_a_second_native_call_is_cut_to_fit_one():
    # 10 rows take two calls of the fused step (each reads every weight): k = 4 for 2 requests costs double
    dl = measured({2: 0.030, 4: 0.034, 6: 0.038, 8: 0.042, 10: 0.085}, [4, 4, 3, 4] * 5)
    assert dl.choose(2, 4) == 3


def test_a_length_never_measured_is_tried():
    dl = DraftLength(8, explore_every=0)
    assert dl.choose(2, 3) == 0  # not even a plain step of 2 rows measured: run one
    dl.observe_step(2, 2, 0.5)  # (its first time pays one-time costs and is not counted)
    assert dl.choose(2, 3) == 0
    dl.observe_step(2, 2, 0.03)
    assert dl.choose(2, 3) == 3  # longer steps unmeasured: taken to cost no more, so tried
    dl.observe_step(2, 8, 0.01)
    dl.observe_step(2, 8, 0.5)
    assert dl.choose(2, 3) == 0  # 4 and 6 rows not measured: the line through 2 and 8 rows prices them out


def test_once_two_lengths_are_measured_the_others_are_read_off_their_line():
    """A short run need not try every length (a new shape's first step is not counted): with 2 and 4 rows
    measured, 6 and 8 rows are priced on the straight line through them, never below a smaller shape."""
    dl = DraftLength(8, explore_every=0)
    for rows, seconds in ((2, 1.0), (2, 0.030), (4, 1.0), (4, 0.034)):
        dl.observe_step(2, rows, seconds)
    assert dl.cost(2, 6) == pytest.approx(0.038) and dl.cost(2, 8) == pytest.approx(0.042)
    assert dl.choose(2, 3) == 3  # every draft accepted so far (the prior): the longest pays on that line
    for rows, seconds in ((6, 1.0), (6, 0.080)):  # one length measured far above the line: the line steepens
        dl.observe_step(2, rows, seconds)
    assert dl.cost(2, 8) > 0.080 and dl.choose(2, 3) == 1
    falling = DraftLength(8)
    for rows, seconds in ((2, 1.0), (2, 0.030), (4, 1.0), (4, 0.020)):  # noise: more rows measured cheaper
        falling.observe_step(2, rows, seconds)
    assert falling.cost(2, 6) == pytest.approx(0.030)  # never a falling line, never below a smaller shape


def test_every_nth_choice_drafts_one_more_to_keep_measuring():
    dl = DraftLength(8, explore_every=4)
    for rows, seconds in {2: 0.03, 4: 0.06, 6: 0.09, 8: 0.12}.items():
        dl.observe_step(2, rows, seconds)
    for _ in range(5):
        dl.observe_verify(3, 0)
    assert [dl.choose(2, 3) for _ in range(8)] == [0, 0, 0, 1, 0, 0, 0, 1]


def test_acceptance_follows_the_latest_verifies():
    dl = DraftLength(4, explore_every=0)
    for _ in range(50):
        dl.observe_verify(2, 2)
    for _ in range(200):
        dl.observe_verify(2, 0)
    assert dl.acceptance()[0] < 0.05
    assert dl.acceptance()[3] == dl.acceptance()[1]  # never drafted: as the position before


def _engine(folder, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(folder), dtype="float32", num_kv_blocks=256, block_size=4,
                                  spec_method="ngram", num_speculative_tokens=3, **kw))


def test_engine_measures_its_steps_and_drafts_only_what_pays(tiny_llama):
    """The engine times each decode/verify step by its rows; once verify rows are measured as costly and
    drafts as rarely accepted, it decodes plainly - with the same output as plain decoding."""
    plain = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=256,
                                   block_size=4)).generate(PROMPTS, GREEDY)
    eng = _engine(tiny_llama)
    dl = eng.spec.draft_length
    dl.explore_every = 0
    ids = [eng.add_request(p, GREEDY) for p in PROMPTS]
    final = {}
    while eng.stats().num_steps < 6:
        for o in eng.step():
            final[o.request_id] = o
    assert (3, 3) in dl.step_s  # a plain decode step of the 3 requests was measured (the first choice)
    one_row = dl.step_s[(3, 3)] / 3
    for requests in (1, 2, 3):  # plain steps as measured; each verify row costs a whole one-row step
        for rows in range(requests, 33):
            dl.step_s[(requests, rows)] = one_row * rows
    dl.observe_step = lambda *args: None  # these costs from now on (a step slowed by another process must not
    # make a plain step look dearer than a verify, as the real times could on a loaded machine)
    for _ in range(100):
        dl.observe_verify(3, 0)
    drafted = eng.stats().num_draft_tokens
    while eng.has_unfinished():
        for o in eng.step():
            final[o.request_id] = o
    assert eng.stats().num_draft_tokens == drafted
    assert [final[i].token_ids for i in ids] == [o.token_ids for o in plain]


@pytest.mark.parametrize("adaptive", [True, False])
def test_the_step_event_says_the_length_drafted(tiny_llama, adaptive):
    eng = _engine(tiny_llama, adaptive_draft_length=adaptive)
    seen = []
    eng.add_listener(lambda ev: seen.append(ev.spec.draft_length))
    eng.generate(PROMPTS, GREEDY)
    assert all(k is None or 0 <= k <= 3 for k in seen)
    assert (3 in seen) and (adaptive == (0 in seen))


def test_sure_requests_draft_and_unsure_ones_do_not_in_the_same_step():
    """Per request, from each draft position's predicted chance (MTP heads' confidence): the rows that pay
    are taken, most likely first, whichever request they belong to."""
    dl = measured({2: 0.030, 3: 0.032, 4: 0.034, 5: 0.060, 6: 0.090}, [])
    # request 0 is sure of two drafts, request 1 unsure of its first
    assert dl.choose_drafts([[0.9, 0.8, 0.1], [0.1, 0.05, 0.01]]) == [2, 0]
    assert dl.last == 2


def test_predicted_chances_are_calibrated_by_what_was_accepted():
    costs = {2: 0.030, 3: 0.033}
    trusting = measured(costs, [])
    assert trusting.choose_drafts([[0.5], [0.0]]) == [1, 0]  # 2.5 tokens in 33 ms beat 2 in 30
    overconfident = measured(costs, [])
    for _ in range(40):  # it said 0.5 and was never right
        overconfident.observe_confident_verify([0.5], 0)
    assert overconfident.calibration() < 0.2
    assert overconfident.choose_drafts([[0.5], [0.0]]) == [0, 0]


def test_an_mtp_chain_is_cut_where_its_chances_stop_paying(tiny_llama_hd64, tmp_path):
    """bf16 on the CPU (the fused step): each request's drafts are the prefix of its heads' chain that
    DraftLength.choose_drafts picked from the heads' confidence; the output is plain decoding's."""
    import torch

    from engine.spec.mtp import MtpHeads, save_heads

    def engine(**kw):
        return LLMEngine(EngineConfig(model=str(tiny_llama_hd64), dtype="bfloat16", num_kv_blocks=64, **kw))

    plain = engine().generate(PROMPTS, GREEDY)
    torch.manual_seed(4)
    heads = MtpHeads(engine().model_config.hidden_size, 3)
    for b in heads.blocks:
        torch.nn.init.normal_(b.weight, std=0.2)
    save_heads(heads, tmp_path / "heads.safetensors", {"model": "tiny"})
    eng = engine(spec_method="mtp", num_speculative_tokens=3, mtp_heads=str(tmp_path / "heads.safetensors"))
    dl = eng.spec.draft_length
    chosen, choose = [], dl.choose_drafts

    def spy(chances, num_rows=None):
        counts = choose(chances, num_rows)
        chosen.append(counts)
        return counts

    dl.choose_drafts = spy
    pairs = []
    propose = eng.spec.propose

    def paired(running):  # each proposal's chosen counts against the drafts the requests then carry
        before = len(chosen)
        propose(running)
        if len(chosen) > before:
            pairs.append((chosen[-1], sum(len(r.spec_token_ids) for r in running)))

    eng.spec.propose = paired
    assert [o.token_ids for o in eng.generate(PROMPTS, GREEDY)] == [o.token_ids for o in plain]
    assert pairs and all(sum(counts) == drafts for counts, drafts in pairs)
    assert any(sum(counts) for counts, _ in pairs)  # some drafts paid
    assert any(sum(counts) < 3 * len(counts) for counts, _ in pairs)  # and some chains were cut


def test_a_lone_stream_does_not_even_run_the_heads_where_no_draft_could_pay():
    dl = DraftLength(8, explore_every=4)
    assert dl.worth_proposing(1)  # nothing measured: find out
    for _ in range(2):  # (each shape's first step is not counted)
        dl.observe_step(1, 1, 0.014)
        dl.observe_step(1, 2, 0.033)  # a second row costs more than a whole one-row step
        dl.observe_step(1, 3, 0.036)
    assert [dl.worth_proposing(1) for _ in range(4)] == [False, False, False, True]  # the 4th explores
    assert dl.worth_proposing(2)  # two streams: a third row is cheap


def test_one_rejection_of_a_rarely_drafted_position_does_not_rule_it_out():
    dl = DraftLength(4, explore_every=0)
    for _ in range(20):
        dl.observe_verify(1, 1)  # position 0 always accepted
    dl.observe_verify(2, 1)  # position 1 drafted once, rejected
    rates = dl.acceptance()
    assert rates[0] > 0.9 and 0.3 < rates[1] < rates[0]


def test_exploration_alternates_above_and_below_the_choice():
    """The plain step's cost stays measured too: a slow outlier there must not make drafting look cheap."""
    dl = measured({2: 0.030, 4: 0.031, 6: 0.050, 8: 0.070}, [1, 1, 1, 1] * 5)
    dl.explore_every = 2
    assert [dl.choose(2, 3) for _ in range(8)] == [1, 2, 1, 0, 1, 2, 1, 0]


def test_a_shape_costs_the_median_of_its_latest_steps():
    dl = DraftLength(4)
    for seconds in (1.0, 0.030, 0.031, 0.300, 0.029):  # the first is not counted; one slowed by another process
        dl.observe_step(2, 2, seconds)
    assert dl.cost(2, 2) == pytest.approx(0.0305)
    assert dl.cost(3, 2) is None and dl.cost(2, 3) == dl.cost(2, 2)
