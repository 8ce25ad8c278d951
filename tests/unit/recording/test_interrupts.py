"""kvscope.recording.interrupts: which ends are interrupts, and SIGTERM unwinding as Terminated."""

from __future__ import annotations

import signal
import threading

import pytest

from kvscope.recording import interrupts
from kvscope.recording.interrupts import Terminated, end_status, interrupts_recorded, is_interrupt


@pytest.mark.parametrize("exc,status", [
    (None, "complete"),
    (KeyboardInterrupt(), "interrupted"),
    (Terminated(), "interrupted"),
    (SystemExit(0), "interrupted"),
    (GeneratorExit(), "interrupted"),
    (RuntimeError("Draft KV cache context resize failed for request 7"), "error"),
    (AssertionError("Sampling failed"), "error"),
])
def test_only_the_engines_own_exception_ends_a_recording_in_error(exc, status):
    assert end_status(exc) == status
    if exc is not None:
        assert is_interrupt(exc) is (status == "interrupted")


def test_terminated_is_a_keyboard_interrupt_named_by_its_signal():
    exc = Terminated()
    assert isinstance(exc, KeyboardInterrupt)
    assert exc.signum == signal.SIGTERM and str(exc) == "SIGTERM"


@pytest.fixture
def default_handlers():
    """SIGTERM at its default action and SIGINT at Python's for the test; put back after."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_sigterm_unwinds_as_terminated_and_is_recorded_inside_the_block(default_handlers):
    before = len(interrupts.received())
    with pytest.raises(Terminated):
        with interrupts_recorded():
            signal.raise_signal(signal.SIGTERM)
    assert interrupts.received()[before:] == (signal.SIGTERM,)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # put back
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sigint_is_still_a_keyboard_interrupt_and_is_recorded_when_the_program_catches_it(default_handlers):
    before = len(interrupts.received())
    with interrupts_recorded():
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt as e:
            caught = e
    assert type(caught) is KeyboardInterrupt
    assert interrupts.received()[before:] == (signal.SIGINT,)


def test_a_handler_of_the_programs_own_is_kept_and_called_after_the_signal_is_recorded(default_handlers):
    seen = []
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    before = len(interrupts.received())
    with interrupts_recorded():
        signal.raise_signal(signal.SIGTERM)  # the program's handler decides: no exception here
        assert interrupts.install() == {}  # idempotent: nothing replaced twice
    assert seen == [signal.SIGTERM]
    assert interrupts.received()[before:] == (signal.SIGTERM,)


def test_an_ignored_signal_stays_ignored(default_handlers):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with interrupts_recorded():
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN


def test_nothing_is_installed_outside_the_main_thread(default_handlers):
    replaced = []
    t = threading.Thread(target=lambda: replaced.append(interrupts.install()))
    t.start()
    t.join()
    assert replaced == [{}]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
