"""Rewrite the generated tables of the docs from the code: ``python docs/generate.py``.

Each generated table follows a ``<!-- generated: EXPRESSION ... -->`` comment and runs
to the end of the file; ``tests/test_docs.py`` fails when a table is out of date.
"""

from __future__ import annotations

import re
from pathlib import Path

from seqtrans.config import RunConfig, markdown_table

DOCS = Path(__file__).resolve().parent


def tables() -> dict[Path, str]:
    from seqtrans_copy import CopyConfig
    from seqtrans_parsing import ParsingConfig
    from seqtrans_translation import TranslationConfig

    out = {DOCS / "configuration.md": markdown_table(RunConfig()),
           DOCS / "tasks" / "copy.md": markdown_table(CopyConfig(), prefix="data."),
           DOCS / "tasks" / "parsing.md": markdown_table(ParsingConfig(), prefix="data."),
           DOCS / "tasks" / "translation.md": markdown_table(TranslationConfig(), prefix="data.")}
    return out


def main() -> None:
    for path, table in tables().items():
        text = path.read_text(encoding="utf-8")
        match = re.search(r"<!-- generated: .*?-->\n", text)
        if match is None:
            raise SystemExit(f"{path}: no '<!-- generated: ... -->' marker")
        path.write_text(text[: match.end()] + table, encoding="utf-8")
        print(f"updated {path.relative_to(DOCS.parent)}")


if __name__ == "__main__":
    main()
