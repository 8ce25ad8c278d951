"""Attach the notebook dashboard to a source: the composition layer of the front end.

:mod:`kvscope.ui` draws and holds widget state but imports no engine; this package wires it to
what runs: a replay of the engine model in a background thread of the kernel
(:class:`BackgroundReplay`, with a ``pace`` so a click lands before a crash would), the live event
stream of another process (:class:`StreamFeed` over :class:`kvscope.engines.live.LiveSubscriber`),
an event file (:class:`kvscope.ui.feeds.FileFeed`), and the remediation controller
(:class:`RemediationSwitch`). Nothing in kvscope imports this package; notebooks do::

    from kvscope.attach import replay_dashboard
    dash = replay_dashboard("shared-prefix", pace=0.5)
    dash
"""

from kvscope.attach.launcher import (
           ReplayLauncher,
           file_dashboard,
           replay_dashboard,
           stream_dashboard,
)
from kvscope.attach.replay import BackgroundReplay
from kvscope.attach.runs import RecordedRun, compare_figure, outcome_table, record_replay
from kvscope.attach.stream import StreamFeed

__all__ = ["BackgroundReplay", "RecordedRun", "ReplayLauncher", "StreamFeed", "compare_figure", "file_dashboard",
           "outcome_table", "record_replay", "replay_dashboard",
           "stream_dashboard"]
