"""drive(): the one step loop for code that runs an engine to a goal by itself (generate(), benchmarks,
sweeps, comparisons, the app's measurement jobs), so none of them writes its own `while ...: engine.step()`.

    drive(engine)                                                 # until nothing is left unfinished
    drive(engine, on_outputs=print_new_text)                      # each step's RequestOutputs
    drive(engine, until=lambda: done >= n, before_step=submit_due, idle_wait=lambda: next_due - now())

It only calls the engine's public verbs (`step`, `has_unfinished`), in the caller's thread: what it
measures or how it isolates itself from the live panels' statistics stays the caller's (its listeners,
its timing windows). An engine run by an EngineLoop is stepped this way only inside the loop's thread (a
RunInLoop job, a host measurement), between the loop's own steps.
"""
from __future__ import annotations

import time
from collections.abc import Callable


def drive(engine, *, until: Callable[[], bool] | None = None, before_step: Callable[[], object] | None = None,
          on_outputs: Callable[[list], object] | None = None, idle_wait: Callable[[], float] | None = None,
          max_steps: int | None = None) -> int:
    """Step `engine` until `until()` is true (checked before every round; default: nothing unfinished) or
    `max_steps` steps ran. Each round: `before_step()` (submit due requests, top up a closed loop, check
    for a cancel: it may raise), then one step, its outputs to `on_outputs`. With `idle_wait`, a round
    that finds nothing unfinished sleeps `idle_wait()` seconds (until the next due request) instead of
    stepping an idle engine. Returns the number of steps run."""
    done = until if until is not None else (lambda: not engine.has_unfinished())
    steps = 0
    while not done() and (max_steps is None or steps < max_steps):
        if before_step is not None:
            before_step()
        if idle_wait is not None and not engine.has_unfinished():
            time.sleep(max(0.0, idle_wait()))
            continue
        outputs = engine.step()
        steps += 1
        if on_outputs is not None:
            on_outputs(outputs)
    return steps
