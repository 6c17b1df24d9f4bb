"""docs/architecture.md names every module of deadman/ and its role in one line, the
first sentence of the module's own docstring, so the page cannot go stale: a module
added, removed or re-described without the page fails here.

After such a change, regenerate it:
``DEADMAN_WRITE_ARCHITECTURE=1 .venv/bin/pytest tests/unit/test_architecture_doc.py``.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "architecture.md"
BEGIN, END = "<!-- modules: begin -->", "<!-- modules: end -->"


def _role(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    m = re.match(r"(.+?[.!?])(?:\s|$)", paragraph)
    return (m.group(1) if m else paragraph).replace("|", "\\|")


def module_table() -> str:
    rows = ["| module | role |", "|---|---|"]
    for path in sorted((REPO / "deadman").rglob("*.py")):
        rows.append(f"| `{path.relative_to(REPO)}` | {_role(path)} |")
    return "\n".join(rows)


def test_every_module_has_a_role() -> None:
    missing = [p for p in (REPO / "deadman").rglob("*.py") if not _role(p)]
    assert missing == [], "modules without a docstring"


def test_the_architecture_page_lists_every_module_and_its_role() -> None:
    text = PAGE.read_text(encoding="utf-8")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    fresh = f"{head}{BEGIN}\n{module_table()}\n{END}{tail}"
    if os.environ.get("DEADMAN_WRITE_ARCHITECTURE"):
        PAGE.write_text(fresh, encoding="utf-8")
    assert text == fresh, "docs/architecture.md is stale; regenerate it (see this module)"
