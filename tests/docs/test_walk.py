"""A reader's first hour: the shell blocks of README.md and docs/getting-started.md run as
written, in order, in a fresh virtual environment, from a clean copy of the tracked files,
each within the time its page states.

How a page is walked:

- Every fenced block of a walked page says what it holds: ``sh`` for commands, ``text``
  for output, ``python`` for Python. The ``sh`` blocks run in page order, each in a new
  ``bash`` that carries over the exported variables and the directory of the blocks
  before it (so ``. .venv/bin/activate`` holds for the rest of the page); a block is a
  list of commands, one a line, and every command must succeed. A ``text`` block right
  after a walked one shows its output: a JSON object there must be the one printed, with
  the same keys and the values the page writes (``...`` for any).
- A marker on the line before a block's fence changes how it is walked, and says why:
  ``<!-- walk: skip: REASON -->`` leaves a block out (it needs a GPU, the network, or
  half an hour); ``<!-- walk: run with --set KEY=VALUE ... -->`` adds those settings to
  each ``seqtrans run`` of the block, a shorter run than a reader's, so that the walk
  costs a minute instead of the minutes of training the page promises.
- A time the block's section states (``at most 4 minutes``, ``about a minute``) is its
  limit, plus :data:`MARGIN`; a section that states none gets :data:`UNSTATED_LIMIT`.
- The virtual environment is new (``python -m venv``), and sees this environment's
  third-party packages (torch, pip and the rest, never this project) through
  ``PYTHONPATH``, which a venv the page makes itself inherits too; pip installs offline
  and without build isolation, resolving the dependencies against those packages (so a
  page's ``pip install torch==X`` holds where X is the torch the tests run with).
  Installs are not editable: a file the package data leaves out is missing there.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from wheels import dependencies, environment

from conftest import ROOT, SHARED_DATA
from seqtrans.cli import COMMANDS

pytestmark = pytest.mark.slow

PAGES = ("README.md", "docs/getting-started.md")
#: Room on top of a page's time: the page times a reader's quiet machine, the walk may share
#: two cores with other work, and it builds the packages it installs.
MARGIN = (1.5, 60.0)  # factor, seconds added
#: The limit of a block whose section states no time: its commands take a minute at most, and a
#: hung one must fail the test rather than CI.
UNSTATED_LIMIT = 180.0

FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```$", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"<!-- walk: (skip: .+|run with --set .+) -->")
HEADING = re.compile(r"^#+ ", re.MULTILINE)
NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "ten": 10}
#: A stated time: "at most 4 minutes", "about a minute", "30 minutes on 2 CPU cores".
DURATION = re.compile(rf"\b(\d+(?:\.\d+)?|{'|'.join(NUMBERS)})\s+(second|minute)s?\b", re.IGNORECASE)
#: Where a page's ``seqtrans run`` command ends: a pipe, a list operator, a comment or the line's end.
#: A JSON object printed (or shown) over several lines, from ``{`` to ``}`` alone on their lines.
OBJECT = re.compile(r"^\{\n.*?^\}$", re.MULTILINE | re.DOTALL)
ANY = "<any value: ... on the page>"
RUN_COMMAND = re.compile(r"(\bseqtrans run\b[^|&;#\n]*?)(\s*(?:[|&;#]|$))", re.MULTILINE)


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: its language, its text, the marker before it (or
    ``""``), the line of its fence and the seconds its section states (0 for none)."""

    language: str
    code: str
    marker: str
    line: int
    stated_s: float

    @property
    def walked(self) -> bool:
        return self.language == "sh" and not self.marker.startswith("skip")

    def limit_s(self) -> float:
        factor, extra = MARGIN
        return self.stated_s * factor + extra if self.stated_s else UNSTATED_LIMIT

    def script(self) -> str:
        """The block's commands for bash, each followed by a check of its status (a
        command in an ``&&`` list does not stop ``set -e``), with the marker's settings
        added to each ``seqtrans run``."""
        code = re.sub(r"\\\n", " ", self.code)  # a continued line is one command
        if self.marker.startswith("run with "):
            code = RUN_COMMAND.sub(rf"\1 {self.marker.removeprefix('run with ')}\2", code)
        lines = ["set -o pipefail"]
        for command in code.splitlines():
            if command.strip() and not command.lstrip().startswith("#"):
                failed = shlex.quote(f"walk: {command.strip()} failed with status ")
                lines += [command, f'status=$?; if [ $status -ne 0 ]; then echo {failed}"$status" >&2; '
                                   'exit $status; fi']
        return "\n".join(lines) + "\n"


def stated_seconds(section: str) -> float:
    """The longest time a section's prose or comments state, in seconds (0 for none); a
    walk marker's reason states none."""
    found = [float(NUMBERS.get(n.lower(), n)) * (60 if unit.lower() == "minute" else 1)
             for n, unit in DURATION.findall(re.sub(r"<!--.*?-->", "", section, flags=re.DOTALL))]
    return max(found, default=0.0)


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a page's markdown, in order."""
    fences = list(FENCE.finditer(text))
    # a comment line in a block is no heading
    starts = [0, *(m.start() for m in HEADING.finditer(text) if not any(f.start() < m.start() < f.end()
                                                                       for f in fences)), len(text)]
    found = []
    for fence in fences:
        before = text[: fence.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.fullmatch(before.strip())
        section = text[max(s for s in starts if s <= fence.start()):
                       min(s for s in starts if s > fence.start())]
        line = text.count("\n", 0, fence.start()) + 1
        found.append(Block(fence[1], fence[2], marker[1] if marker else "", line, stated_seconds(section)))
    return found


def walked_pages() -> dict[str, list[Block]]:
    return {page: blocks((ROOT / page).read_text(encoding="utf-8")) for page in PAGES}


def test_every_block_of_a_walked_page_says_what_it_holds_and_how_it_is_walked() -> None:
    for page, found in walked_pages().items():
        text = (ROOT / page).read_text(encoding="utf-8")
        assert [b.line for b in found if not b.language] == [], f"{page}: a block without its language"
        assert any(b.walked for b in found), page
        markers = [m.start() for m in re.finditer(r"<!-- walk", text)]
        assert len(markers) == sum(bool(b.marker) for b in found), (
            f"{page}: a walk marker that is malformed or not on the line before a fence")
        for block in found:
            if block.marker.startswith("run with"):
                assert RUN_COMMAND.search(block.code), f"{page}:{block.line}: no seqtrans run to set"


def test_the_blocks_are_read_as_the_page_writes_them() -> None:
    text = ("# Start\n\nTraining takes at most 4 minutes:\n\n"
            "<!-- walk: run with --set train.max_steps=5 -->\n```sh\n"
            "pip install ./ && seqtrans run copy   # trains\necho 1 | \\\n  seqtrans predict runs/x\n```\n\n"
            "```text\n{}\n```\n\n## Later\n\nAbout a minute, then half an hour:\n\n"
            "<!-- walk: skip: needs the network -->\n```sh\nseqtrans run translation\n```\n\n"
            "```python\n# not a heading\nimport seqtrans\n```\n\n```sh\nseqtrans tasks\n```\n")
    first, output, network, python, tasks = blocks(text)
    assert (first.language, first.walked, first.line, first.stated_s) == ("sh", True, 6, 240.0)
    assert first.limit_s() == 240 * MARGIN[0] + MARGIN[1]
    assert "seqtrans run copy --set train.max_steps=5   # trains\n" in first.script()
    assert "echo 1 |    seqtrans predict runs/x\n" in first.script()
    assert first.script().count("exit $status") == 2
    assert (output.language, output.walked) == ("text", False)
    assert (network.marker, network.walked, network.stated_s) == ("skip: needs the network", False, 60.0)
    assert (python.walked, python.stated_s, tasks.walked) == (False, 60.0, True)
    assert "--set" not in tasks.script() and tasks.limit_s() == 60 * MARGIN[0] + MARGIN[1]
    assert blocks("```sh\nls\n```\n")[0].limit_s() == UNSTATED_LIMIT


def test_a_failing_command_stops_its_block_and_one_over_its_limit_is_killed(tmp_path: Path) -> None:
    failing = Block("sh", "false && true   # an && list: set -e would go on\necho after\n", "", 1, 0)
    assert run_block(failing.script(), cwd=tmp_path, env=environment(), limit_s=30) == (
        1, "walk: false && true   # an && list: set -e would go on failed with status 1\n")
    piped = Block("sh", "false | cat\necho after\n", "", 1, 0)
    assert run_block(piped.script(), cwd=tmp_path, env=environment(), limit_s=30)[0] == 1
    # the shell's child outlives the limit: killed with it, its output read so far
    start = time.monotonic()
    status, output = run_block("sleep 30 & echo $! > child; echo started; wait", cwd=tmp_path,
                               env=environment(), limit_s=1)
    assert (status, output) == (None, "started\n") and time.monotonic() - start < 15
    child = Path("/proc") / (tmp_path / "child").read_text().strip() / "stat"
    for _ in range(100):  # the kill is sent; the child is gone (or a zombie) once it is delivered
        if not child.exists() or child.read_text().rsplit(")", 1)[-1].split()[0] == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail("the block's child outlived the block's limit")


def test_a_json_object_the_page_shows_is_the_one_printed() -> None:
    shown = '{\n  "a": ...,\n  "b": 3\n}\nrun directory: runs/x\n'
    assert_shows(shown, 'log\n{\n  "a": 0.5,\n  "b": 3\n}\nrun directory: runs/y\n', place="p")
    assert_shows("no object here\n", "", place="p")
    wrong = ('{\n  "a": 1,\n  "b": 4\n}\n', '{\n  "a": 1\n}\n', '{\n  "a": 1, "b": 3, "c": 4\n}\n', "none")
    for printed in wrong:
        with pytest.raises(AssertionError):
            assert_shows(shown, printed, place="p")


# --- walking them ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def walk_root() -> Iterator[Path]:
    """Where the walks happen, removed afterwards: each holds a virtual environment and
    the packages it built."""
    with tempfile.TemporaryDirectory(prefix="seqtrans-walk-") as folder:
        yield Path(folder)


@pytest.fixture(scope="module")
def third_party(walk_root: Path) -> Path:
    return dependencies(walk_root / "third-party")


def tracked_copy(to: Path) -> Path:
    """A copy of the files git tracks, as the working tree has them: uncommitted edits
    are walked, an untracked file is not there (as in a clone)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    assert listed.returncode == 0, f"the walk copies the files git tracks: {listed.stderr}"
    for name in filter(None, listed.stdout.split("\0")):
        if (ROOT / name).is_file():  # a tracked file deleted in the working tree stays deleted
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, to / name)
    return to


def fresh_venv(venv: Path, third_party: Path) -> dict[str, str]:
    """A new virtual environment, with pip; -> the variables of a shell it is activated
    in, no other environment's ``bin`` on the path, pip offline and without build
    isolation, downloads read from the shared data."""
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and not (Path(p).parent / "pyvenv.cfg").is_file()]
    env = {**environment(), "PATH": os.pathsep.join([str(venv / "bin"), *path]), "VIRTUAL_ENV": str(venv),
           "PYTHONPATH": str(third_party), "PIP_NO_INDEX": "1",
           "PIP_CONFIG_FILE": os.devnull,  # no user's pip settings (an index, --user)
           "PIP_NO_BUILD_ISOLATION": "0",  # pip reads it backwards (pypa/pip#5735): 0 turns isolation off
           "SEQTRANS_MIRROR": str(SHARED_DATA / "multi30k")}
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env=env,
                          capture_output=True, text=True, timeout=UNSTATED_LIMIT)
    assert made.returncode == 0, made.stderr
    # pip is this environment's, seen through PYTHONPATH, with the command its wheel installs
    # (ensurepip would add seconds of a busy CPU to each walk for the same pip)
    for name in ("pip", "pip3"):
        (venv / "bin" / name).write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\n"
                                         "from pip._internal.cli.main import main\nsys.exit(main())\n")
        (venv / "bin" / name).chmod(0o755)
    return env


def run_block(script: str, *, cwd: Path, env: dict[str, str], limit_s: float) -> tuple[int | None, str]:
    """``script`` in bash: its exit status and output (stderr with stdout); ``None`` and
    the output so far when it outlasts ``limit_s``, its processes killed (the group: a
    command the shell started would otherwise live on, holding the output open)."""
    with subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as process:
        try:
            output, _ = process.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            return None, output
    return process.returncode, output


def assert_shows(shown: str, output: str, *, place: str) -> None:
    """Where the page shows a JSON object that a block prints (in a ``text`` block right
    after it), the block printed one with those keys, and the values the page writes
    (``...`` stands for any)."""
    page_object = OBJECT.search(shown)
    if page_object is None:
        return
    any_value = re.sub(r":\s*\.\.\.(?=,?$)", f": {json.dumps(ANY)}", page_object[0], flags=re.MULTILINE)
    wanted = json.loads(any_value)
    printed = OBJECT.search(output)
    assert printed, f"{place}: the page shows a JSON object after it, the block printed none:\n{output}"
    got = json.loads(printed[0])
    assert sorted(got) == sorted(wanted), f"{place} printed other keys than its page shows: {got}"
    differ = {key: (value, got[key]) for key, value in wanted.items() if value != ANY and got[key] != value}
    assert not differ, f"{place} printed other values than its page shows (page, printed): {differ}"


def walk(page: str, blocks_: list[Block], *, work: Path, third_party: Path) -> list[str]:
    """Walks a page's blocks in a fresh environment, from a clean copy in ``work``; fails
    at the first block that fails or outlasts its limit. -> a line on each block walked."""
    checkout = tracked_copy(work / "checkout")
    env = fresh_venv(work / "venv", third_party)
    state, where = work / "state.sh", work / "cwd"
    where.write_text(str(checkout))
    done = []
    for block, after in zip(blocks_, [*blocks_[1:], None]):
        if not block.walked:
            continue
        carried = f'if [ -f {state} ]; then . {state}; fi\ncd "$(cat {where})"\n'
        kept = f"export -p > {state}\npwd > {where}\n"
        start = time.monotonic()
        status, output = run_block(carried + block.script() + kept, cwd=checkout, env=env,
                                   limit_s=block.limit_s())
        seconds = time.monotonic() - start
        place = f"{page}, the block at line {block.line}"
        limit = f"{block.limit_s():.0f} s (the page's time with MARGIN)"
        assert status is not None, f"{place} took over {limit}:\n{output}"
        assert status == 0, f"{place} failed:\n{output}"
        if after is not None and after.language == "text":
            assert_shows(after.code, output, place=place)
        done.append(f"{place}: {seconds:.0f} s of {block.limit_s():.0f} s")
    return done


@pytest.mark.parametrize("page", PAGES)
def test_a_reader_walks_the_page_in_a_fresh_environment(page: str, walk_root: Path,
                                                        third_party: Path) -> None:
    work = walk_root / Path(page).stem
    done = walk(page, walked_pages()[page], work=work, third_party=third_party)
    print("\n".join(done))
    shutil.rmtree(work)  # its environment and builds: the other walks need the room, not them


def test_the_engine_alone_installs_and_its_command_answers(walk_root: Path, third_party: Path) -> None:
    """A user who installs only the engine (``python -m pip install .``, no plugin) gets a
    working ``seqtrans``: its help, a list of tasks that says none is installed, and a
    run of the README's task that says what to install."""
    work = walk_root / "engine"
    checkout = tracked_copy(work / "checkout")
    env = fresh_venv(work / "venv", third_party)
    status, output = run_block("python -m pip install .", cwd=checkout, env=env, limit_s=UNSTATED_LIMIT)
    assert status == 0, output
    status, output = run_block("seqtrans --help", cwd=work, env=env, limit_s=UNSTATED_LIMIT)
    assert status == 0 and output.startswith("usage: seqtrans"), output
    assert all(f"    {command}" in output for command in COMMANDS), output
    status, output = run_block("seqtrans tasks", cwd=work, env=env, limit_s=UNSTATED_LIMIT)
    assert (status, output) == (0, "no tasks installed (pip install a plugin such as plugins/copy)\n")
    status, output = run_block("seqtrans run copy", cwd=work, env=env, limit_s=UNSTATED_LIMIT)
    assert status == 2 and "installed tasks: none (install a plugin such as seqtrans-copy)" in output, output
    status, output = run_block("python -c 'import seqtrans; print(seqtrans.__file__)'", cwd=work, env=env,
                               limit_s=UNSTATED_LIMIT)
    assert status == 0 and Path(output.strip()).is_relative_to(work / "venv"), output
    shutil.rmtree(work)
