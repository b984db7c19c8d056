"""``python -m benchmarks NAME [ARGS...]``: run one benchmark; without a name, list them.

The command as given is recorded (:func:`benchmarks.common.running`), so that the results
the benchmark writes say which command made them.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Sequence

from benchmarks import benchmarks


def listing() -> str:
    found = benchmarks()
    width = max(map(len, found))
    lines = [f"  {name:<{width}}  {summary}" for name, summary in found.items()]
    return "\n".join(["usage: python -m benchmarks NAME [ARGS...]  (NAME --help: its options)", "",
                      "benchmarks:", *lines])


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(listing())
        return 0
    name, rest = argv[0], list(argv[1:])
    if name not in benchmarks():
        close = difflib.get_close_matches(name, benchmarks(), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        print(f"python -m benchmarks: no benchmark {name!r}{hint}\n\n{listing()}", file=sys.stderr)
        return 2
    # imported only now: a benchmark's imports are its own
    from benchmarks.common import running

    module = importlib.import_module(f"benchmarks.{name}")
    try:
        with running(["python", "-m", "benchmarks", name, *rest]):
            code = module.main(rest)
    except KeyboardInterrupt:  # stopped by hand: no traceback
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
