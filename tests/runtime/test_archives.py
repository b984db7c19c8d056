"""Extracting members of downloaded archives: only regular files, only inside the target,
every refusal and every damaged archive a DataError naming the archive and the member."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqtrans.errors import DataError
from seqtrans.runtime import download

FILES = {"dev/a.en": b"one\ntwo\n", "b.de": b"eins\n"}


def _tar(path: Path, files: dict[str, bytes], *, links: dict[str, tuple[bytes, str]] | None = None) -> Path:
    """A gzipped tar of ``files``; ``links`` adds members name -> (type, target)."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, (kind, target) in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, target
            tar.addfile(info)
    return path


def _zip(path: Path, files: dict[str, bytes], *, symlinks: dict[str, str] | None = None) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
        for name, target in (symlinks or {}).items():  # as Info-ZIP stores a link: the mode says so
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            z.writestr(info, target)
    return path


Make = Callable[[Path, dict[str, bytes]], Path]  # an archive of these files
BOTH: list[Make] = [_tar, _zip]


def _everything(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("make", BOTH)
def test_the_named_members_are_extracted_and_nothing_else(tmp_path: Path, make: Make) -> None:
    archive = make(tmp_path / "a", {**FILES, "other.txt": b"not asked for\n"})
    paths = download.extract(archive, ["dev/a.en", "b.de"], tmp_path / "out")
    assert {m: p.read_bytes() for m, p in paths.items()} == FILES
    assert paths["dev/a.en"] == tmp_path / "out" / "dev" / "a.en"
    assert _everything(tmp_path / "out") == ["b.de", "dev", "dev/a.en"]  # no temporary files left


@pytest.mark.parametrize("make", BOTH)
@pytest.mark.parametrize("name", ["../evil", "dev/../../evil", "/tmp/evil", "..\\evil", ""])
def test_a_member_name_that_leads_out_of_the_directory_is_refused(tmp_path: Path, make: Make,
                                                                  name: str) -> None:
    archive = make(tmp_path / "a", {**FILES, name or "x": b"pwned\n"})
    out = tmp_path / "deep" / "out"
    with pytest.raises(DataError) as caught:
        download.extract(archive, ["b.de", name], out)
    assert str(caught.value).startswith(f"{archive}: refused the member name {name!r}")
    assert not (tmp_path / "evil").exists() and not (tmp_path / "deep" / "evil").exists()
    assert not out.exists()  # refused before anything was written


@pytest.mark.parametrize("make", BOTH)
def test_a_traversal_member_that_is_not_asked_for_is_never_written(tmp_path: Path, make: Make) -> None:
    archive = make(tmp_path / "a", {**FILES, "../evil": b"pwned\n"})
    download.extract(archive, ["b.de"], tmp_path / "out")
    assert not (tmp_path / "evil").exists() and _everything(tmp_path / "out") == ["b.de"]


@pytest.mark.parametrize(("kind", "target", "words"), [
    (tarfile.SYMTYPE, "../../outside", "a symbolic link to '../../outside'"),
    (tarfile.SYMTYPE, "b.de", "a symbolic link to 'b.de'"),  # even to a member inside
    (tarfile.LNKTYPE, "b.de", "a hard link to 'b.de'"),
    (tarfile.DIRTYPE, "", "a directory"),
])
def test_a_tar_member_that_is_a_link_is_refused(tmp_path: Path, kind: bytes, target: str, words: str) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"secret\n")
    archive = _tar(tmp_path / "a.tgz", FILES, links={"dev/link": (kind, target)})
    with pytest.raises(DataError) as caught:
        download.extract(archive, ["dev/link"], tmp_path / "x" / "out")
    assert str(caught.value) == f"{archive}: refused the member 'dev/link': it is {words}"
    assert outside.read_bytes() == b"secret\n" and not (tmp_path / "x" / "out" / "dev" / "link").exists()


def test_a_zip_member_that_is_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "a.zip", FILES, symlinks={"dev/link": "../../outside"})
    with pytest.raises(DataError, match=r"a.zip: refused the member 'dev/link': it is a symbolic link"):
        download.extract(archive, ["dev/link"], tmp_path / "out")
    assert not (tmp_path / "out" / "dev" / "link").exists()


@pytest.mark.parametrize("make", BOTH)
def test_a_missing_member_names_the_archive_and_the_member(tmp_path: Path, make: Make) -> None:
    archive = make(tmp_path / "a", FILES)
    with pytest.raises(DataError, match=r"^.*/a: the archive holds no 'dev/b.en'$"):
        download.extract(archive, ["dev/b.en"], tmp_path / "out")


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(make=st.sampled_from(BOTH), cut=st.floats(0.0, 1.0),
       flips=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(1, 255)), max_size=4))
def test_a_damaged_archive_is_a_data_error(tmp_path: Path, make: Make, cut: float,
                                           flips: list[tuple[float, int]]) -> None:
    whole = make(tmp_path / "whole", {"dev/a.en": b"line\n" * 2000, "b.de": b"eins\n"}).read_bytes()
    data = bytearray(whole[: max(1, int(len(whole) * cut))] if cut < 1 else whole)
    for where, mask in flips:
        data[min(int(where * len(data)), len(data) - 1)] ^= mask
    damaged = tmp_path / "damaged"
    damaged.write_bytes(bytes(data))
    try:
        paths = download.extract(damaged, ["dev/a.en", "b.de"], tmp_path / "out")
    except DataError as err:
        assert err.path == damaged and str(err).startswith(f"{damaged}: ")
    else:  # the damage missed what was read: what was written is whole
        assert all(p.is_file() for p in paths.values())
