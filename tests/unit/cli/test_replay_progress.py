"""The replay's progress line: on a terminal only, first after a few seconds, at most every 0.5 s,
cleared at the end; quiet under --json and into a pipe; a broken stderr never stops the replay."""

from __future__ import annotations

import io

from kvscope.cli import main
from kvscope.commands._progress import ProgressLine
from kvscope.engine_model.build import build_engine
from kvscope.replay.scenarios import get_scenario


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _executor():
    return build_engine(get_scenario("oversize").config).executor


def test_the_line_waits_a_few_seconds_then_redraws_at_most_every_half_second_and_is_cleared():
    stream, clock, executor = Terminal(), Clock(), _executor()
    line = ProgressLine(stream, clock=clock, delay_s=3.0, interval_s=0.5)
    for now in (100.0, 101.0, 102.9):
        clock.now = now
        line(executor)
    assert stream.getvalue() == ""  # a short replay prints nothing
    clock.now = 103.0
    line(executor)
    first = stream.getvalue()
    assert first == "\r  replaying: 0 simulated s, 0 of 0 requests done, 0 running"
    clock.now = 103.4
    line(executor)
    assert stream.getvalue() == first  # within the interval: not redrawn
    clock.now = 103.5
    executor.stats.requests_completed = 1234  # as the loop counts them
    executor.stats.requests_total = 1300
    line(executor)
    last = "  replaying: 0 simulated s, 1,234 of 1,300 requests done, 0 running"
    assert stream.getvalue() == first + "\r" + last
    line.close()  # blanks the widest line drawn, then returns to the start of the line
    assert stream.getvalue() == first + "\r" + last + "\r" + " " * len(last) + "\r"


def test_nothing_to_clear_when_nothing_was_drawn():
    stream = Terminal()
    line = ProgressLine(stream, clock=Clock())
    line.close()
    assert stream.getvalue() == ""


def test_only_a_terminal_gets_a_progress_line_and_never_under_json():
    assert isinstance(ProgressLine.on_terminal(quiet=False, stream=Terminal()), ProgressLine)
    assert ProgressLine.on_terminal(quiet=True, stream=Terminal()) is None
    assert ProgressLine.on_terminal(quiet=False, stream=io.StringIO()) is None  # a pipe or a file


def test_a_broken_stderr_ends_the_display_not_the_replay():
    class Closed(Terminal):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    clock, executor = Clock(), _executor()
    line = ProgressLine(Closed(), clock=clock, delay_s=0.0)
    line(executor)  # raises nothing: the executor's loop would take an exception for an engine failure
    clock.now += 1
    line(executor)
    line.close()


def test_a_replay_into_a_pipe_prints_no_progress(capsys):
    assert main(["replay", "--scenario", "oversize"]) == 0
    assert capsys.readouterr().err == ""
