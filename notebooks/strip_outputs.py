"""Notebooks are kept without outputs in the repository.

    python notebooks/strip_outputs.py           strip outputs, execution counts and widget state in place
    python notebooks/strip_outputs.py --check   exit 1 naming every notebook that still has some (make lint)

Standard library only (a notebook is JSON), so the lint step needs nothing installed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def problems(nb: dict) -> list[str]:
    out = []
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        if cell.get("outputs"):
            out.append(f"cell {i}: outputs")
        if cell.get("execution_count") is not None:
            out.append(f"cell {i}: execution_count")
    if "widgets" in nb.get("metadata", {}):
        out.append("metadata.widgets (saved widget state)")
    return out


def strip(nb: dict) -> dict:
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    nb.get("metadata", {}).pop("widgets", None)
    return nb


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [Path(a) for a in argv if not a.startswith("--")] or sorted(HERE.glob("*.ipynb"))
    dirty = 0
    for path in paths:
        nb = json.loads(path.read_text(encoding="utf-8"))
        found = problems(nb)
        if not found:
            continue
        if check:
            dirty += 1
            print(f"{path}: not stripped ({'; '.join(found[:5])}); run python notebooks/strip_outputs.py",
                  file=sys.stderr)
        else:
            path.write_text(json.dumps(strip(nb), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            print(f"stripped {path}")
    return 1 if dirty else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
