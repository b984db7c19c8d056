"""Downloading files into a cache, verified by sha256 before anything uses them.

Any plugin that needs published data calls :func:`fetch`:

- The file is streamed into a temporary file beside its cache entry, with a progress
  bar, and hashed on the way; only when its sha256 matches the expected digest is it
  renamed into place. The cache therefore never holds a half-written or unverified
  file, and an interrupted transfer (a dropped connection, Ctrl-C, a killed process)
  leaves at most a temporary ``.NAME.XXXXXXXX.tmp`` file that later runs ignore.
- A digest mismatch is a :class:`~seqtrans.errors.DownloadError` naming the URL, the
  expected and the actual digest, and leaves no cache entry.
- A mirror replaces the base of every URL, so files are found there by name:
  ``https://host/a/b/train.en.gz`` with mirror ``file:///data/multi30k`` is read from
  ``/data/multi30k/train.en.gz``. ``file://`` and ``http(s)://`` mirrors work, and a
  plain directory path is taken as ``file://``.
- The cache directory is, in order of precedence, the ``cache`` argument (a task's
  config key), ``$SEQTRANS_CACHE_DIR``, ``$XDG_CACHE_HOME/seqtrans`` or
  ``~/.cache/seqtrans``; the mirror is the ``mirror`` argument or ``$SEQTRANS_MIRROR``.

Members of a downloaded tar or zip archive are read with :func:`extract`, which writes
only the regular files asked for, by names that stay inside the target directory: an
archive is data from elsewhere, and a member named ``../x`` or a symbolic link must
not write or read outside it.
"""

from __future__ import annotations

import hashlib
import logging
import lzma
import re
import stat
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import IO, BinaryIO

from tqdm import tqdm

from seqtrans.errors import DataError, DownloadError
from seqtrans.runtime import atomic, environment

log = logging.getLogger(__name__)

CACHE_ENV = environment.CACHE_DIR
MIRROR_ENV = environment.MIRROR
_CHUNK = 1 << 20
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def cache_dir(override: str | Path | None = None) -> Path:
    """Where downloads are cached: ``override``, else ``$SEQTRANS_CACHE_DIR``, else the
    user's cache directory (``$XDG_CACHE_HOME/seqtrans`` or ``~/.cache/seqtrans``)."""
    if override:
        return Path(override).expanduser()
    if environment.cache_dir():
        return Path(environment.cache_dir()).expanduser()
    base = environment.xdg_cache_home() or Path.home() / ".cache"
    return Path(base) / "seqtrans"


def file_name(url: str) -> str:
    """The last component of a URL's path: the name a file has in a mirror and the cache."""
    name = Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path)).name
    if not name:
        raise DownloadError(f"{url}: the URL names no file")
    return name


def mirror_url(url: str, mirror: str | None = None) -> str:
    """``url`` as found in ``mirror`` (or ``$SEQTRANS_MIRROR``); ``url`` itself without one."""
    mirror = mirror or environment.mirror()
    if not mirror:
        return url
    if "://" not in mirror:  # a plain directory path
        mirror = Path(mirror).expanduser().resolve().as_uri()
    return mirror.rstrip("/") + "/" + urllib.parse.quote(file_name(url))


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(url: str, *, sha256: str, cache: str | Path | None = None, subdir: str = "",
          mirror: str | None = None, progress: bool | None = None, timeout: float = 60.0) -> Path:
    """The cached, verified copy of ``url``, downloading it on first use.

    The file lives at ``cache_dir(cache) / subdir / file_name(url)``. A cached file is
    verified again before it is returned; one that no longer matches (a damaged disk,
    an edited file) is downloaded anew. ``progress`` None shows a bar on a terminal.
    """
    sha256 = sha256.lower()
    if not _SHA256.match(sha256):
        raise ValueError(f"{url}: expected a sha256 digest of 64 hex digits, got {sha256!r}")
    target = cache_dir(cache) / subdir / file_name(url)
    if target.is_file():
        actual = sha256_file(target)
        if actual == sha256:
            return target
        log.warning("%s: cached file has sha256 %s, expected %s; downloading it again",
                    target, actual, sha256)
        target.unlink()
    source = mirror_url(url, mirror)
    log.info("downloading %s to %s", source, target)
    with atomic.replacing(target, durable=True) as out:
        actual = _copy(source, out, name=target.name, progress=progress, timeout=timeout)
        if actual != sha256:
            where = f" (through the mirror: {source})" if source != url else ""
            raise DownloadError(f"{url}: sha256 mismatch{where}: expected {sha256}, got {actual}; "
                                "nothing was stored in the cache")
    return target


def _copy(source: str, out: BinaryIO, *, name: str, progress: bool | None, timeout: float) -> str:
    """Stream ``source`` into the binary file ``out``; the sha256 of what was read."""
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(source, timeout=timeout) as response:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            received = 0
            with tqdm(total=total, desc=name, unit="B", unit_scale=True, unit_divisor=1024,
                      disable=None if progress is None else not progress, leave=False) as bar:
                while chunk := response.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise DownloadError(f"{source}: download failed: {reason}") from None
    except Exception as exc:  # http.client.IncompleteRead and other transfer errors
        raise DownloadError(f"{source}: download failed: {type(exc).__name__}: {exc}") from None
    if total is not None and received != total:
        raise DownloadError(f"{source}: download interrupted after {received} of {total} bytes")
    return digest.hexdigest()



def extract(archive: str | Path, members: Sequence[str], directory: str | Path) -> dict[str, Path]:
    """Extract the regular files ``members`` of a tar (plain or compressed) or zip archive
    into ``directory``, each written to a temporary name and renamed; where each went.

    A name that would leave ``directory`` (absolute, or with a ``..`` part), a member
    missing from the archive, and one that is not a regular file (a symbolic or hard
    link, a directory, a device) are a :class:`~seqtrans.errors.DataError` naming the
    archive and the member; so is a damaged archive.
    """
    archive, directory = Path(archive), Path(directory)
    paths = {m: directory.joinpath(*_inside(archive, m)) for m in members}
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as z:
                for member in members:
                    _write_atomic(paths[member], _zip_member(archive, z, member))
        else:
            with tarfile.open(archive, "r:*") as tar:
                for member in members:
                    _write_atomic(paths[member], _tar_member(archive, tar, member))
    # zipfile raises NotImplementedError for methods and versions it lacks, RuntimeError
    # for an encrypted member and UnicodeDecodeError for a name; lzma its own error
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, lzma.LZMAError, OSError, EOFError, ValueError,
            NotImplementedError, RuntimeError) as exc:
        raise DataError(archive, None, f"cannot extract from the archive: {exc}") from None
    return paths


def _inside(archive: Path, member: str) -> tuple[str, ...]:
    """The parts of a member's name, refused when it would lead out of the target."""
    path = PurePosixPath(member)
    if not member or path.is_absolute() or ".." in path.parts or "\\" in member:
        raise DataError(archive, None, f"refused the member name {member!r}: it leads out of the directory "
                                       "it is extracted into")
    return path.parts


def _tar_member(archive: Path, tar: tarfile.TarFile, member: str) -> IO[bytes]:
    try:
        info = tar.getmember(member)
    except KeyError:
        raise DataError(archive, None, f"the archive holds no '{member}'") from None
    if not info.isreg():  # extractfile() would follow a link to wherever it points
        kind = ("a symbolic link" if info.issym() else "a hard link" if info.islnk()
                else "a directory" if info.isdir() else "not a regular file")
        target = f" to {info.linkname!r}" if info.issym() or info.islnk() else ""
        raise DataError(archive, None, f"refused the member '{member}': it is {kind}{target}")
    source = tar.extractfile(info)
    assert source is not None  # a regular file always has a reader
    return source


def _zip_member(archive: Path, z: zipfile.ZipFile, member: str) -> IO[bytes]:
    try:
        info = z.getinfo(member)
    except KeyError:
        raise DataError(archive, None, f"the archive holds no '{member}'") from None
    mode = info.external_attr >> 16  # Unix mode bits, where the archive has them
    if info.is_dir() or stat.S_ISLNK(mode) or (stat.S_IFMT(mode) and not stat.S_ISREG(mode)):
        kind = "a symbolic link" if stat.S_ISLNK(mode) else "a directory" if info.is_dir() else "not a file"
        raise DataError(archive, None, f"refused the member '{member}': it is {kind}")
    return z.open(info)


def _write_atomic(path: Path, source: IO[bytes]) -> None:
    with source, atomic.replacing(path) as out:
        while chunk := source.read(_CHUNK):
            out.write(chunk)
