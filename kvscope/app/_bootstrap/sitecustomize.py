# kvscope-instrument bootstrap: this directory is put first on PYTHONPATH by `kvscope-instrument`,
# so every Python process started under it runs this at start-up. It loads kvscope's autoload
# (configured by KVSCOPE_* environment variables), then runs any other sitecustomize that this one
# shadows. It never stops the process: a failure is printed once to stderr.
import importlib as _importlib
import os as _os
import sys as _sys

try:
    _importlib.import_module("kvscope.app.autoload").boot()
except Exception as _e:  # noqa: BLE001
    if _os.environ.get("KVSCOPE_DEBUG"):
        raise
    print(f"kvscope-instrument: autoload failed, continuing without kvscope: {_e!r}", file=_sys.stderr)

_here = _os.path.dirname(_os.path.abspath(__file__))
for _entry in _sys.path:
    if _entry and _os.path.abspath(_entry) != _here and _os.path.isfile(_os.path.join(_entry, "sitecustomize.py")):
        _path = _os.path.join(_entry, "sitecustomize.py")
        with open(_path, encoding="utf-8") as _fh:
            exec(compile(_fh.read(), _path, "exec"), {"__name__": "sitecustomize", "__file__": _path})
        break
