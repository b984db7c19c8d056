"""Rewrite the generated tables of the docs from the code: ``python docs/generate.py``.

Each generated table follows a ``<!-- generated: EXPRESSION ... -->`` comment and runs
to the end of the file; ``tests/test_docs.py`` fails when a table is out of date.
"""

from __future__ import annotations

import re
from pathlib import Path

from seqtrans.config import RunConfig, markdown_table

DOCS = Path(__file__).resolve().parent


def cli_reference() -> str:
    """Every engine command with its arguments, from the argument parser itself."""
    import argparse

    from seqtrans.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in commands._choices_actions}
    out = []
    for name, sub in commands.choices.items():
        out.append(f"## `seqtrans {name}`\n\n{helps.get(name) or ''}\n\n{sub.description or ''}\n")
        rows = []
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.metavar or action.dest}`"
            if action.option_strings and action.nargs != 0:
                names += f" {action.metavar or action.dest.upper()}"
            choices = f" One of: {', '.join(map(str, action.choices))}." if action.choices else ""
            default = "" if action.default in (None, False, [], argparse.SUPPRESS) else f"`{action.default}`"
            help_text = (action.help or "").replace("|", "\\|")
            rows.append(f"| {names} | {default} | {help_text}{choices} |")
        if rows:
            out.append("| argument | default | what it does |\n|---|---|---|\n" + "\n".join(rows) + "\n")
    return "\n" + "\n".join(out)


def tables() -> dict[Path, str]:
    from seqtrans_copy import CopyConfig
    from seqtrans_parsing import ParsingConfig
    from seqtrans_translation import TranslationConfig

    out = {DOCS / "configuration.md": markdown_table(RunConfig()),
           DOCS / "tasks" / "copy.md": markdown_table(CopyConfig(), prefix="data."),
           DOCS / "tasks" / "parsing.md": markdown_table(ParsingConfig(), prefix="data."),
           DOCS / "tasks" / "translation.md": markdown_table(TranslationConfig(), prefix="data."),
           DOCS / "cli.md": cli_reference()}
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
