"""Downloads: the real code against the shared Multi30k files, served through file:// and
through an HTTP server on 127.0.0.1; bad digests and broken transfers leave no cache entry."""

from __future__ import annotations

import hashlib
import http.server
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import SHARED_DATA
from seqtrans.errors import DownloadError
from seqtrans.runtime import download
from seqtrans.tasks.testing import serve, without_download_settings

MULTI30K = SHARED_DATA / "multi30k"
URL = "https://example.org/multi30k/raw/{}"
# published in the shared data's README
VAL_EN_SHA256 = "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28"
VAL_DE_SHA256 = "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a"


class _Truncating(http.server.BaseHTTPRequestHandler):
    """Announces the whole file, sends half of it, and hangs up."""

    def do_GET(self) -> None:
        data = (MULTI30K / Path(self.path).name).read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def truncating_mirror() -> Iterator[str]:
    with serve(_Truncating) as url:
        yield url


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    without_download_settings(monkeypatch)


def _entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*")) if directory.exists() else []


def test_a_file_mirror_fills_the_cache_with_the_verified_file(tmp_path: Path) -> None:
    path = download.fetch(URL.format("val.en.gz"), sha256=VAL_EN_SHA256, cache=tmp_path, subdir="m30k",
                          mirror=MULTI30K.as_uri())
    assert path == tmp_path / "m30k" / "val.en.gz"
    assert path.read_bytes() == (MULTI30K / "val.en.gz").read_bytes()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == VAL_EN_SHA256
    assert _entries(tmp_path) == ["m30k", "val.en.gz"]
    # a plain directory works as a mirror too, and a cached file needs no mirror at all
    again = download.fetch(URL.format("val.en.gz"), sha256=VAL_EN_SHA256, cache=tmp_path, subdir="m30k",
                           mirror=str(tmp_path / "nowhere"))
    assert again == path


def test_an_http_mirror_serves_files_by_name(tmp_path: Path, http_mirror: str) -> None:
    path = download.fetch(URL.format("val.de.gz"), sha256=VAL_DE_SHA256, cache=tmp_path, mirror=http_mirror)
    assert path.read_bytes() == (MULTI30K / "val.de.gz").read_bytes()


def test_a_checksum_mismatch_is_an_error_and_leaves_no_cache_entry(tmp_path: Path, http_mirror: str) -> None:
    wrong = "0" * 64
    url = URL.format("val.de.gz")
    with pytest.raises(DownloadError) as caught:
        download.fetch(url, sha256=wrong, cache=tmp_path, subdir="m30k", mirror=http_mirror)
    message = str(caught.value)
    assert url in message and wrong in message and VAL_DE_SHA256 in message
    assert _entries(tmp_path / "m30k") == []
    with pytest.raises(DownloadError):  # the same through file://
        download.fetch(url, sha256=wrong, cache=tmp_path, subdir="m30k", mirror=MULTI30K.as_uri())
    assert _entries(tmp_path / "m30k") == []


def test_an_interrupted_transfer_does_not_poison_later_runs(tmp_path: Path, truncating_mirror: str,
                                                            http_mirror: str) -> None:
    url = URL.format("val.en.gz")
    with pytest.raises(DownloadError, match="interrupted"):
        download.fetch(url, sha256=VAL_EN_SHA256, cache=tmp_path, mirror=truncating_mirror)
    assert _entries(tmp_path) == []
    path = download.fetch(url, sha256=VAL_EN_SHA256, cache=tmp_path, mirror=http_mirror)
    assert path.read_bytes() == (MULTI30K / "val.en.gz").read_bytes()


def test_a_download_stopped_by_the_user_leaves_nothing_behind(tmp_path: Path, http_mirror: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object, **kwargs: object) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(download, "_copy", interrupted)
    with pytest.raises(KeyboardInterrupt):
        download.fetch(URL.format("val.en.gz"), sha256=VAL_EN_SHA256, cache=tmp_path, mirror=http_mirror)
    assert _entries(tmp_path) == []


def test_a_damaged_cache_entry_is_downloaded_again(tmp_path: Path) -> None:
    target = tmp_path / "val.en.gz"
    target.write_bytes(b"half a file")
    path = download.fetch(URL.format("val.en.gz"), sha256=VAL_EN_SHA256, cache=tmp_path, mirror=str(MULTI30K))
    assert path.read_bytes() == (MULTI30K / "val.en.gz").read_bytes()


def test_a_missing_file_names_the_url(tmp_path: Path, http_mirror: str) -> None:
    with pytest.raises(DownloadError, match="no-such-file.gz"):
        download.fetch(URL.format("no-such-file.gz"), sha256=VAL_EN_SHA256, cache=tmp_path,
                       mirror=http_mirror)
    with pytest.raises(DownloadError, match="no-such-file.gz"):
        download.fetch(URL.format("no-such-file.gz"), sha256=VAL_EN_SHA256, cache=tmp_path,
                       mirror=MULTI30K.as_uri())
    assert _entries(tmp_path) == []


def test_environment_variables_set_the_mirror_and_the_cache(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(download.MIRROR_ENV, MULTI30K.as_uri())
    monkeypatch.setenv(download.CACHE_ENV, str(tmp_path / "env-cache"))
    path = download.fetch(URL.format("val.en.gz"), sha256=VAL_EN_SHA256)
    assert path == tmp_path / "env-cache" / "val.en.gz"
    # arguments (a task's config keys) win over the environment
    assert download.cache_dir(tmp_path / "arg") == tmp_path / "arg"
    assert download.mirror_url("https://h/a/b.gz", "http://m/x/") == "http://m/x/b.gz"
    assert download.mirror_url("https://h/a/b.gz") == MULTI30K.as_uri() + "/b.gz"
    monkeypatch.delenv(download.MIRROR_ENV)
    monkeypatch.delenv(download.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert download.cache_dir() == tmp_path / "xdg" / "seqtrans"
    assert download.mirror_url("https://h/a/b.gz") == "https://h/a/b.gz"


def test_digests_must_be_sha256() -> None:
    with pytest.raises(ValueError, match="sha256"):
        download.fetch(URL.format("val.en.gz"), sha256="abc")


def test_a_temporary_file_left_by_a_killed_process_is_ignored(tmp_path: Path) -> None:
    # a process killed mid-transfer leaves its temporary file; the cache entry is absent
    # and the next run downloads the file whole beside it
    (tmp_path / ".val.en.gz.k1ll3d.tmp").write_bytes(b"\x1f\x8b half")
    path = download.fetch(URL.format("val.en.gz"), sha256=VAL_EN_SHA256, cache=tmp_path,
                          mirror=MULTI30K.as_uri())
    assert path == tmp_path / "val.en.gz"
    assert path.read_bytes() == (MULTI30K / "val.en.gz").read_bytes()


def test_downloads_show_a_progress_bar_on_request(tmp_path: Path, http_mirror: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    download.fetch(URL.format("val.de.gz"), sha256=VAL_DE_SHA256, cache=tmp_path, mirror=http_mirror,
                   progress=True)
    shown = capsys.readouterr().err
    assert "val.de.gz" in shown and "/24.1k" in shown  # the total: the 24,681 bytes the server announced
    download.fetch(URL.format("val.en.gz"), sha256=VAL_EN_SHA256, cache=tmp_path, mirror=http_mirror,
                   progress=False)
    assert "val.en.gz" not in capsys.readouterr().err
