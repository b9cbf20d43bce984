"""The thread governor on a simulated machine: fewer threads while others keep cores busy, and back."""

from __future__ import annotations

from collections.abc import Callable

from workers.engines.thread_governor import (
    HOLD_MIN_S,
    SAMPLE_S,
    TRIAL_STEPS,
    ThreadGovernor,
)


class Machine:
    """A clock for the governor: `others` CPUs busy outside the worker, the worker using `own`."""

    def __init__(self) -> None:
        self.t = 0.0
        self.busy = 0.0
        self.own = 0.0
        self.others = 0.0
        self.worker = 0.0

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.busy += (self.others + self.worker) * seconds
        self.own += self.worker * seconds

    def __call__(self) -> tuple[float, float, float]:
        return self.t, self.busy, self.own


def governor(
    cap: int = 2, cpus: int = 2, runnable: Callable[[], int | None] = lambda: None
) -> tuple[ThreadGovernor, Machine]:
    m = Machine()
    return ThreadGovernor(cap, cpus=cpus, clock=m, runnable=runnable), m


def run(g: ThreadGovernor, m: Machine, seconds: float, step_s: dict[int, float], tokens: int = 1) -> list[int]:
    """Decode for `seconds`, each step taking step_s[threads]; the thread count of every step."""
    used = []
    end = m.t + seconds
    while m.t < end:
        n = g.threads_for_step()
        used.append(n)
        m.worker = n
        m.advance(step_s[n])
        g.after_step(tokens, step_s[n])
    return used


IDLE = {1: 0.0105, 2: 0.0067}  # measured: bare decode steps of SmolLM2-135M on 2 cores
ONE_BUSY = {1: 0.0104, 2: 0.0144}


def test_idle_machine_keeps_every_thread() -> None:
    g, m = governor()
    assert set(run(g, m, 5.0, IDLE)) == {2}


def test_a_busy_program_takes_a_thread_and_gives_it_back_when_it_stops() -> None:
    g, m = governor()
    run(g, m, 1.0, IDLE)
    m.others = 1.0
    used = run(g, m, 3.0, ONE_BUSY)
    assert used[-1] == 1 and used.count(2) < len(used) // 4
    m.others = 0.0
    used = run(g, m, 3.0, IDLE)
    assert used[-1] == 2


def test_a_light_background_load_does_not_cost_a_thread() -> None:
    g, m = governor()
    m.others = 0.2  # a gateway relaying, a browser tab idling
    assert set(run(g, m, 5.0, IDLE)) == {2}


def test_more_threads_that_are_not_faster_are_given_back_and_not_retried_at_once() -> None:
    g, m = governor()
    m.others = 1.0
    run(g, m, 2.0, ONE_BUSY)
    assert g.threads == 1
    # The accounting says a core is free, but two threads are slower (a CPU quota, say).
    m.others = 0.0
    quota = {1: 0.010, 2: 0.030}
    used = run(g, m, 1.0, quota)
    assert used.count(2) == TRIAL_STEPS and used[-1] == 1
    used = run(g, m, HOLD_MIN_S + SAMPLE_S * 2, quota)
    assert used.count(2) <= TRIAL_STEPS  # held back, then at most one more trial


def test_steps_far_slower_than_the_best_lower_the_count_without_any_accounting_signal() -> None:
    g, m = governor()
    run(g, m, 1.0, IDLE)
    used = run(g, m, 1.0, {1: 0.011, 2: 0.2})  # collapse at two threads; others look idle
    assert used[-1] == 1


def test_the_gateway_cap_bounds_the_threads_and_raising_it_waits_for_free_cores() -> None:
    g, m = governor(cap=4, cpus=4)
    g.set_cap(1)
    assert g.threads == 1
    g.set_cap(4)
    steps = {1: 0.02, 2: 0.011, 3: 0.008, 4: 0.0065}
    used = run(g, m, 4.0, steps)
    assert used[0] == 1 and used[-1] == 4
    m.others = 2.0
    used = run(g, m, 2.0, steps)
    assert used[-1] == 2


def test_work_after_idle_reads_the_machine_afresh() -> None:
    g, m = governor()
    m.others = 2.0  # another program decodes while this worker idles
    for _ in range(4):
        m.advance(0.5)
        g.idle()
    assert g.threads == 1
    m.others = 0.0
    m.advance(0.1)  # it stopped; a request arrives before the next idle reading
    assert g.threads_for_step() == 2


def test_two_busy_workers_with_the_gateways_shares_do_not_fight() -> None:
    """The pool gives each of two busy workers one of two cores; each then sees the other as a
    busy program, which agrees with the share; when one stops, the other gets both back."""
    a, ma = governor()
    b, mb = governor()
    a.set_cap(1)
    b.set_cap(1)
    steps = {1: 0.0105, 2: 0.0067}
    for _ in range(200):
        for g, m, other in ((a, ma, b), (b, mb, a)):
            m.others = other.threads
            n = g.threads_for_step()
            m.worker = n
            m.advance(steps[n])
            g.after_step(1, steps[n])
        assert a.threads == b.threads == 1
    a.set_cap(2)  # b went idle: the pool gives a both cores
    mb.others = 0
    ma.others = 0.0
    used = run(a, ma, 2.0, steps)
    assert used[-1] == 2


def test_a_burst_that_ended_as_the_request_came_does_not_cost_the_first_step_a_thread() -> None:
    running = {"now": 1}  # this thread alone is runnable when the request arrives
    g, m = governor(runnable=lambda: running["now"])
    g.idle()
    m.others = 2.0  # another server answered until this very moment
    m.advance(0.4)
    assert g.threads_for_step() == 2
    # ...but a program still running now does take its core
    g2, m2 = governor(runnable=lambda: 2)
    g2.idle()
    m2.others = 1.0
    m2.advance(0.4)
    assert g2.threads_for_step() == 1


def test_fewer_threads_on_a_reading_right_after_idle_are_tentative_until_a_fresh_one() -> None:
    g, m = governor(runnable=lambda: 2)
    g.idle()
    m.others = 2.0
    m.advance(0.4)
    assert g.threads_for_step() == 1 and g.tentative  # the engine keeps this step short
    m.others = 0.0
    m.advance(0.3)
    g.threads_for_step()
    assert not g.tentative
