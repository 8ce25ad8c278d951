"""The engine-model side of the binding: the CPU model's classes and pool reader (same hooks).

The replay's recording session (the ``instrument=`` callable ``kvscope replay --events PATH`` hands
to ``kvscope.replay.run``) composes this adapter with a recorder and sinks: it is a composition root,
:mod:`kvscope.app.session`.
"""
