import logging

from pairaudit.core.progress import Progress


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_rate_and_eta_from_new_items_only(caplog):
    clock = Clock()
    # 4 of 10 were done by an earlier run: they must not inflate the rate.
    p = Progress(10, "sampled arith/control", done=4, every_s=10, clock=clock)
    caplog.set_level(logging.INFO, logger="pairaudit")
    clock.t += 20
    p.step()  # 1 new item in 20 s -> 0.05/s, 5 left -> 100 s
    assert p.lines == ["sampled arith/control: 5/10 (50 %), 0.05/s, ETA 1m40s"]
    assert p.lines[0] in caplog.text


def test_throttled_but_the_last_line_always_comes():
    clock = Clock()
    p = Progress(3, "greedy", every_s=60, clock=clock)
    clock.t += 1
    p.step()
    clock.t += 1
    p.step()
    assert p.lines == []  # under a minute since the start: no line yet
    clock.t += 1
    p.step()
    assert p.lines == ["greedy: 3/3 (100 %), 1/s, ETA 0m00s"]


def test_no_rate_yet_gives_unknown_eta_and_hours_format():
    clock = Clock()
    p = Progress(7200, "speed waves", clock=clock)
    assert p.line().endswith("ETA ?")
    clock.t += 1
    p.step()  # 1/s with 7199 left -> just under two hours
    assert p.line() == "speed waves: 1/7200 (0 %), 1/s, ETA 1h59m59s"
