"""Warm-up until iteration time is steady (energysweep.measure.warmup), bounded and recorded."""

from __future__ import annotations

from energysweep.measure.warmup import max_seconds, steady, warm_up


class Timed:
    """A step whose i-th call takes ``times[i]`` s on a fake clock (the last one repeats)."""

    def __init__(self, times):
        self.times, self.now, self.calls = list(times), 0.0, 0

    def clock(self):
        return self.now

    def step(self, i):
        assert i == self.calls
        self.now += self.times[min(i, len(self.times) - 1)]
        self.calls += 1


def run(t: Timed, min_iterations=1, max_s=100.0, gather=lambda x: [x]):
    return warm_up(
        t.step, lambda: None, min_iterations=min_iterations, max_s=max_s, clock=t.clock,
        gather=gather,
    )  # fmt: skip


def test_runs_until_the_last_three_iterations_agree():
    # The H200's first generate windows: slow, then steady.
    t = Timed([3.0, 1.4, 1.2, 1.0, 1.0, 1.02])
    got = run(t)
    assert got["iterations"] == 6 and got["steady"] is True
    assert got["seconds"] == sum(t.times)
    assert got["last_iteration_s"] == [1.0, 1.0, 1.02]


def test_at_least_min_iterations_even_when_steady_at_once():
    got = run(Timed([1.0]), min_iterations=7)
    assert got["iterations"] == 7 and got["steady"] is True


def test_bounded_by_max_s_and_says_it_was_not_steady():
    t = Timed([1.0, 2.0] * 50)  # never steady
    got = run(t, max_s=9.5)
    assert got["steady"] is False and got["iterations"] == 7  # 1+2+1+2+1+2+1 = 10 >= 9.5
    assert t.calls == 7


def test_zero_turns_warm_up_off():
    t = Timed([5.0])
    assert run(t, min_iterations=0)["iterations"] == 0 and t.calls == 0


def test_one_unsteady_rank_keeps_every_rank_going():
    others = iter([(False, 0.0)] * 4 + [(True, 0.0)] * 10)
    got = run(Timed([1.0]), gather=lambda mine: [mine, next(others)])
    assert got["iterations"] == 5  # steady here from the 3rd, the other rank from its 5th


def test_steady_rule_and_bound():
    assert not steady([1.0, 1.0])
    assert steady([5.0, 1.0, 1.05, 1.0]) and not steady([1.0, 1.2, 1.0])
    assert max_seconds(None, 5) == 10 and max_seconds(3, 5) == 3
