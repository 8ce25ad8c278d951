"""The floor of composition roots: the modules that wire kvscope's layers into something that runs.

Each module composes parts that may not import one another: remediation with an engine
(:mod:`remedy`, :mod:`hosted`, :mod:`sizing`, one parser of the ``MODE[:POLICY]`` setting in
:mod:`remediation_setting`), the recording session of a replay (:mod:`session`), the
``kvscope-instrument`` launcher and the worker bootstrap it loads (:mod:`launcher`, :mod:`autoload`,
``_bootstrap/sitecustomize.py``), the checks of event files given as input (:mod:`inputs`) and the
``kvscope export --follow`` service (:mod:`follow`). The CLI (``kvscope.cli``, ``kvscope.commands``)
and the notebook layer (``kvscope.attach``) sit above this package; nothing below imports it
(import-linter's layers contract). Importing the package imports none of its modules: every Python
process ``kvscope-instrument`` starts loads :mod:`autoload` through it.
"""
