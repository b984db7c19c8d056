"""The results pages of the docs, generated from ``benchmarks/results/*.json``.

``python docs/generate.py`` writes them: ``docs/results/index.md`` and one page per
benchmark, on which each of its results files shows the command that made it, the
processor, its settings and provenance (commit, whether the tree had changes, whether the
machine was quiet) and its numbers as tables, with the pictures the benchmark draws. The
same script lists the pages in ``mkdocs.yml``'s "Results" section; ``tests/docs/test_docs.py``
checks that both are up to date with the files.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGES = DOCS / "results"
MKDOCS = ROOT / "mkdocs.yml"

#: Pictures a benchmark draws (under docs/images/), shown on its page.
PICTURES = {"attention_copy": ["attention_copy.png"],
            "distill_multi30k": ["distill-multi30k.png"],
            "simultaneous_multi30k": ["simultaneous-multi30k.png"]}
#: The keys of a results file that say how it was made rather than what it measured.
RECORD = {"provenance", "source", "made"}
#: The processor's instruction sets that decide which kernels run, when the record has flags.
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
#: A list of numbers longer than this is summarised by its length, first and last value.
LONG_LIST = 8
#: A table of records with more fields than this has a column per record instead.
WIDE = 10
#: What wraps a page's generated text: `python docs/generate.py` writes it, and the docs'
#: number checks skip it (its numbers are the files' own).
BEGIN, END = "<!-- begin generated: results -->\n", "<!-- end generated: results -->\n"


def _benchmarks() -> dict[str, str]:
    """Each benchmark's name and one-line summary, read as the runner reads them."""
    from benchmarks import benchmarks

    return benchmarks()


def benchmark_of(name: str, data: dict[str, Any], known: dict[str, str]) -> str:
    """The benchmark that wrote results file ``name``: the one its command runs, else the
    longest benchmark name that begins the file's name."""
    command = (data.get("provenance") or {}).get("command") or ""
    ran = re.search(r"benchmarks(?:/| )(\w+)", command)
    if ran and ran[1] in known:
        return ran[1]
    stem = name.removesuffix(".json")
    prefixes = [b for b in known if stem == b or stem.startswith(b + "-")]
    return max(prefixes, key=len) if prefixes else stem.split("-")[0]


def number(value: Any) -> str:
    """A value as a table cell: numbers to at least four significant digits."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value == 0 or not math.isfinite(value):
            return str(value)
        if abs(value) < 1e-3:
            return f"{value:.3e}"
        return f"{value:,.{max(1, 3 - math.floor(math.log10(abs(value))))}f}"
    if value is None:
        return "-"
    if isinstance(value, list):
        if len(value) > LONG_LIST:
            return f"{len(value)} values, {number(value[0])} … {number(value[-1])}"
        return ", ".join(number(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {number(v)}" for k, v in value.items())
    # a value is text, not markup: a table's pipes and HTML's angle brackets escaped
    return str(value).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def _scalar(value: Any) -> bool:
    """Whether ``value`` fits a table cell: not a dict, nor a list of dicts."""
    if isinstance(value, dict):
        return all(not isinstance(v, (dict, list)) for v in value.values()) and len(value) <= LONG_LIST
    return not (isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value))


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def _rows_table(rows: dict[str, dict[str, Any]], first: str) -> str:
    """A table of records, a row each (its key first), a column per key any record has."""
    columns: list[str] = []
    for record in rows.values():
        columns += [k for k, v in record.items() if _scalar(v) and k not in columns]
    cell = {(key, c): number(record[c]) if c in record else ""
            for key, record in rows.items() for c in columns}
    if len(columns) > WIDE:  # a column per record and a row per field reads better than a wide table
        return _table([first, *map(number, rows)], [[c, *(cell[key, c] for key in rows)] for c in columns])
    return _table([first, *columns], [[number(key), *(cell[key, c] for c in columns)] for key in rows])


def tables(data: Any, title: str, depth: int = 0) -> list[str]:
    """``data``'s numbers as markdown: its scalars in a table of values, each list or dict
    of records as a table of rows, anything deeper under a heading of its own path."""
    out: list[str] = []
    if isinstance(data, list):
        records = {str(i): r for i, r in enumerate(data, 1)}
        return [f"**{title}**\n\n" + _rows_table(records, "#")] if records else []
    values = [[k, number(v)] for k, v in data.items() if _scalar(v) and k not in RECORD]
    if values:
        out.append((f"**{title}**\n\n" if depth else "") + _table(["", "value"], values))
    for key, value in data.items():
        if key in RECORD or _scalar(value):
            continue
        path = f"{title} / {key}" if depth else key
        if isinstance(value, list) and all(isinstance(v, dict) for v in value):
            out += tables(value, path, depth + 1)
        elif isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()) \
                and all(_scalar(x) for v in value.values() for x in v.values()):
            out.append(f"**{path}**\n\n" + _rows_table(value, key))
        elif isinstance(value, dict):
            out += tables(value, path, depth + 1)
        else:
            out.append(f"**{path}**: {len(value)} values: {number(value)}\n")
    return out


def _processor(record: dict[str, Any], data: dict[str, Any]) -> str:
    cpu = record.get("cpu") or {}
    text = ", ".join(str(x) for x in (cpu.get("model") or data.get("device") or data.get("machine"),
                                      f"{cpu['cores']} cores" if cpu.get("cores") else None) if x)
    flags = [f for f in FLAGS if f in (cpu.get("flags") or [])]
    return (text or "not recorded") + (f" ({', '.join(flags)})" if flags else "")


def provenance(data: dict[str, Any]) -> str:
    """The command, processor, software, commit and quiet of one results file, as a table."""
    record = data.get("provenance") or {}
    commit = record.get("commit")
    dirty = {True: ", the tree had changes", False: ", a clean tree", None: ""}[record.get("dirty")]
    quiet = {True: "yes", False: "no (other work ran beside it)", None: "not recorded"}[record.get("quiet")]
    rows = [["command", f"`{record['command']}`" if record.get("command") else "not recorded"],
            ["processor", _processor(record, data)],
            ["PyTorch, threads", f"{record.get('torch') or data.get('torch') or '-'}, "
                                 f"{number(record.get('threads') or data.get('threads'))}"],
            ["commit", (f"`{commit[:7]}`" if commit else "not recorded") + dirty],
            ["quiet", quiet],
            ["written", record.get("time") or data.get("time") or "not recorded"]]
    if record.get("environment"):
        rows.append(["environment", number(record["environment"])])
    if data.get("source") == "manual":
        rows.append(["completed by hand", number(data.get("made", ""))])
    return _table(["", ""], rows)


def anchor(name: str) -> str:
    """The id of a results file's section on its page: its name without ``.json``."""
    return name.removesuffix(".json")


def section(name: str, data: dict[str, Any]) -> str:
    """One results file: its provenance, settings and numbers."""
    out = [f"## `{name}` {{#{anchor(name)}}}\n", provenance(data)]
    arguments = (data.get("provenance") or {}).get("arguments")
    if isinstance(arguments, dict) and arguments:
        out.append("Settings:\n\n" + _table(["argument", "value"],
                                            [[k, number(v)] for k, v in arguments.items()]))
    out += tables({k: v for k, v in data.items() if k not in RECORD}, name)
    return "\n".join(out)


def page(benchmark: str, summary: str, files: dict[str, dict[str, Any]]) -> str:
    """A benchmark's page: what it measures, how to run it, each of its results files."""
    head = f"# {benchmark}\n\n{BEGIN}\n{summary or 'Results files.'}\n\n"
    run = (f"Run it with `python -m benchmarks {benchmark} ...` (`--help` lists its options); "
           "benchmarks/README.md says what it measures. ")
    out = [head + run + f"{len(files)} results file{'s' if len(files) > 1 else ''}:\n\n"
           + "\n".join(f"- [`{n}`](#{anchor(n)})" for n in files) + "\n"]
    out += [f"![{benchmark}](../images/{picture})\n" for picture in PICTURES.get(benchmark, [])]
    out += [section(name, data) for name, data in files.items()]
    return "\n".join(out) + "\n" + END


def grouped() -> dict[str, dict[str, dict[str, Any]]]:
    """Every results file, by the benchmark that wrote it (both in name order)."""
    known = _benchmarks()
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        out.setdefault(benchmark_of(path.name, data, known), {})[path.name] = data
    return dict(sorted(out.items()))


def index(groups: dict[str, dict[str, dict[str, Any]]], summaries: dict[str, str]) -> str:
    rows = [[f"[{b}]({b}.md)", summaries.get(b, ""), str(len(files)),
             str(sum((f.get("provenance") or {}).get("quiet") is True for f in files.values()))]
            for b, files in groups.items()]
    return (f"# Results\n\n{BEGIN}\nEvery results file under `benchmarks/results/`, by the "
            "benchmark that wrote it: its command, processor, settings, provenance and numbers. "
            "[Speed](../speed.md) says what they mean for decoding; benchmarks/README.md how to "
            "run them and what each found.\n\n"
            + _table(["benchmark", "what it measures", "files", "on a quiet machine"], rows) + "\n" + END)


def pages() -> dict[Path, str]:
    """Every results page: path -> the text it should have."""
    groups = grouped()
    summaries = _benchmarks()
    out = {PAGES / "index.md": index(groups, summaries)}
    for benchmark, files in groups.items():
        out[PAGES / f"{benchmark}.md"] = page(benchmark, summaries.get(benchmark, ""), files)
    return out


NAV = re.compile(r"(?m)^(?P<indent> *)# begin generated: results\n.*?^ *# end generated: results\n",
                 re.DOTALL)


def nav(text: str, names: list[str]) -> str:
    """``mkdocs.yml``'s text with its generated list of results pages set to ``names``."""
    match = NAV.search(text)
    if match is None:
        raise SystemExit(f"{MKDOCS.name}: no '# begin generated: results' ... '# end generated: results'")
    indent = match["indent"]
    lines = [f"{indent}# begin generated: results", f"{indent}- Overview: results/index.md"]
    lines += [f"{indent}- {name}: results/{name}.md" for name in names]
    return text[: match.start()] + "\n".join(lines + [f"{indent}# end generated: results"]) + "\n" \
        + text[match.end():]


def write() -> list[Path]:
    """Write the results pages, remove those of benchmarks with no results file left, and
    list them in ``mkdocs.yml``; the paths written."""
    wanted = pages()
    PAGES.mkdir(exist_ok=True)
    for stale in set(PAGES.glob("*.md")) - set(wanted):
        stale.unlink()
    for path, text in wanted.items():
        path.write_text(text, encoding="utf-8")
    names = sorted(p.stem for p in wanted if p.stem != "index")
    MKDOCS.write_text(nav(MKDOCS.read_text(encoding="utf-8"), names), encoding="utf-8")
    return [*wanted, MKDOCS]
