"""Named datasets through the real download code: Multi30k from the shared data, and
the WMT 2014 path (URL list, archive extraction, file pairing) with small fake archives."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import tarfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from seqtrans.inference import evaluation  # internal: the engine's count of what the reader skipped
from seqtrans.plugin import (
    CACHE_ENV,
    MIRROR_ENV,
    DataError,
    DownloadError,
    Example,
    Skipped,
    file_name,
    serve_directory,
    without_download_settings,
)
from seqtrans_translation import TranslationConfig, TranslationTask, datasets
from translation_data import MULTI30K, multi30k_task


@pytest.fixture
def http_mirror() -> Iterator[str]:
    """The shared Multi30k files served on 127.0.0.1."""
    with serve_directory(MULTI30K) as url:
        yield url


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    without_download_settings(monkeypatch)


def test_multi30k_has_its_published_sizes_in_both_directions(tmp_path: Path) -> None:
    task = multi30k_task(tmp_path)
    sizes = {split: len(list(task.read(split))) for split in ("train", "dev", "test")}
    assert sizes == {"train": 29000, "dev": 1014, "test": 1000}
    first = next(task.read("test"))
    assert (first.source, first.target) == ("A man in an orange hat starring at something.",
                                            "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.")
    back = next(multi30k_task(tmp_path, source_lang="de", target_lang="en").read("test"))
    assert (back.source, back.target) == (first.target, first.source)
    for test_set, size in [("test_2017_flickr", 1000), ("test_2017_mscoco", 461), ("test_2018_flickr", 1071)]:
        assert len(list(multi30k_task(tmp_path, test_set=test_set).read("test"))) == size
    # every file went through the cache, verified
    cached = sorted(p.name for p in (tmp_path / "cache" / "multi30k").iterdir())
    assert len(cached) == 12 and not any(name.startswith(".") for name in cached)


def test_a_mirror_with_a_different_file_fails_verification(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for name in ("train.en.gz", "train.de.gz"):
        (mirror / name).write_bytes((MULTI30K / "train.en.gz").read_bytes())  # de is wrong
    with pytest.raises(DownloadError, match=r"train.de.gz: sha256 mismatch"):
        list(multi30k_task(tmp_path, mirror=str(mirror)).read("train"))
    assert not (tmp_path / "cache" / "multi30k" / "train.de.gz").exists()


def test_data_mirror_over_http_wins_over_the_environment(tmp_path: Path, http_mirror: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MIRROR_ENV, str(tmp_path / "no-such-mirror"))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "env-cache"))
    task = multi30k_task(tmp_path, mirror=http_mirror)  # data.mirror and data.cache_dir, as --set gives them
    dev = list(task.read("dev"))
    assert len(dev) == 1014 and dev[0].origin.startswith(str(tmp_path / "cache" / "multi30k" / "val.en.gz"))
    assert sorted(p.name for p in (tmp_path / "cache" / "multi30k").iterdir()) == ["val.de.gz", "val.en.gz"]
    assert not (tmp_path / "env-cache").exists()
    # without the keys the environment decides: its mirror is missing, so nothing is cached there
    with pytest.raises(DownloadError, match="no-such-mirror"):
        list(TranslationTask(TranslationConfig()).read("dev"))
    assert not any(p.is_file() for p in (tmp_path / "env-cache").rglob("*"))


# --------------------------------------------------------------------------- WMT 2014 en-de

_EN = ["Resumption of the session", "", "Hello world .", "news one", "news two"]
_DE = ["Wiederaufnahme der Sitzung", "nur Deutsch", "Hallo Welt .", "Nachricht eins", "Nachricht zwei"]


def _tgz(path: Path, files: Mapping[str, str]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _sgm(lang: str, segments: list[str]) -> str:
    segs = "".join(f'<seg id="{i}">{s}</seg>\n' for i, s in enumerate(segments, 1))
    head = '<srcset setid="newstest2014" srclang="any">\n<doc docid="d1" genre="news">\n'
    return f"{head}{segs}</doc>\n</srcset>\n"


@pytest.fixture
def wmt_mirror(tmp_path: Path) -> Path:
    """Small archives with the real archives' names and layout."""
    mirror = tmp_path / "wmt-mirror"
    mirror.mkdir()
    _tgz(mirror / "training-parallel-europarl-v7.tgz", {
        "training/europarl-v7.de-en.en": "\n".join(_EN[:2]) + "\n",
        "training/europarl-v7.de-en.de": "\n".join(_DE[:2]) + "\n",
        "training/europarl-v7.fr-en.en": "not wanted\n",
    })
    _tgz(mirror / "training-parallel-commoncrawl.tgz", {
        "commoncrawl.de-en.en": _EN[2] + "\n", "commoncrawl.de-en.de": _DE[2] + "\n"})
    _tgz(mirror / "training-parallel-nc-v9.tgz", {
        "training/news-commentary-v9.de-en.en": "\n".join(_EN[3:]) + "\n",
        "training/news-commentary-v9.de-en.de": "\n".join(_DE[3:]) + "\n"})
    _tgz(mirror / "dev.tgz", {
        "dev/newstest2013.en": "dev one\ndev two\n", "dev/newstest2013.de": "Dev eins\nDev zwei\n",
        "dev/newstest2014-deen-src.de.sgm": _sgm("de", ["Test eins", "", "Test  drei "]),
        "dev/newstest2014-deen-ref.en.sgm": _sgm("en", ["test one", "test two", "test three"]),
    })
    return mirror


def _with_digests(dataset: datasets.Dataset, mirror: Path) -> datasets.Dataset:
    """The dataset with the fake archives' digests in place of the published ones."""
    def side(s: datasets.Side) -> datasets.Side:
        name = file_name(s.remote.url)
        digest = hashlib.sha256((mirror / name).read_bytes()).hexdigest()
        return dataclasses.replace(s, remote=datasets.Remote(s.remote.url, digest))

    def corpora(cs: list[datasets.Corpus]) -> list[datasets.Corpus]:
        return [{lang: side(s) for lang, s in c.items()} for c in cs]

    return dataclasses.replace(dataset, train=corpora(list(dataset.train)), dev=corpora(list(dataset.dev)),
                               tests={k: corpora(list(v)) for k, v in dataset.tests.items()})


def test_the_wmt14_urls_are_the_standard_corpora() -> None:
    urls = {s.remote.url for s in datasets._sides(datasets.WMT14_EN_DE)}
    assert urls == {"http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
                    "http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
                    "http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz",
                    "http://data.statmt.org/wmt19/translation-task/dev.tgz"}


def test_wmt14_is_fetched_extracted_and_paired_through_a_mirror(
        tmp_path: Path, wmt_mirror: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the real digests reject the fake archives ...
    with pytest.raises(DownloadError, match="training-parallel-europarl-v7.tgz: sha256 mismatch"):
        list(multi30k_task(tmp_path, dataset="wmt14-en-de", mirror=str(wmt_mirror)).read("train"))
    # ... so the test swaps in theirs; everything else is the real code path
    monkeypatch.setitem(datasets.DATASETS, "wmt14-en-de", _with_digests(datasets.WMT14_EN_DE, wmt_mirror))
    task = multi30k_task(tmp_path, dataset="wmt14-en-de", mirror=wmt_mirror.as_uri())
    train = list(task.read("train"))
    # the corpora in order, the pair with an empty side left out and reported
    assert [(e.source, e.target) for e in train if isinstance(e, Example)] == \
        [(e, d) for e, d in zip(_EN, _DE) if e and d]
    assert [s.reason for s in train if isinstance(s, Skipped)] == ["empty source or target"]
    dev = [(e.source, e.target) for e in task.read("dev")]
    assert dev == [("dev one", "Dev eins"), ("dev two", "Dev zwei")]
    test = list(task.read("test"))
    assert [(e.source, e.target) for e in test] == [("test one", "Test eins"), ("test two", ""),
                                                     ("test three", "Test drei")]
    back = multi30k_task(tmp_path, dataset="wmt14-en-de", mirror=wmt_mirror.as_uri(), source_lang="de",
                 target_lang="en")
    assert [e.source for e in back.read("test")] == ["Test eins", "", "Test drei"]
    # extracted once: later runs need neither the mirror nor the archives
    for archive in (tmp_path / "cache" / "wmt14-en-de").glob("*.tgz"):
        archive.unlink()
    offline = multi30k_task(tmp_path, dataset="wmt14-en-de", mirror=str(tmp_path / "gone"))
    assert len(evaluation.read_split(offline, "train").examples) == 4 and len(list(offline.read("test"))) == 3


def test_an_interrupted_extraction_is_done_again(tmp_path: Path, wmt_mirror: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(datasets.DATASETS, "wmt14-en-de", _with_digests(datasets.WMT14_EN_DE, wmt_mirror))
    task = multi30k_task(tmp_path, dataset="wmt14-en-de", mirror=str(wmt_mirror))
    assert len(list(task.read("dev"))) == 2
    extracted = tmp_path / "cache" / "wmt14-en-de" / "dev.tgz.d"
    (extracted / ".complete").unlink()
    (extracted / "dev" / "newstest2013.en").write_text("truncated")
    assert [e.source for e in task.read("dev")] == ["dev one", "dev two"]


def test_an_archive_without_the_expected_member_is_a_data_error(
        tmp_path: Path, wmt_mirror: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tgz(wmt_mirror / "training-parallel-commoncrawl.tgz", {"commoncrawl.fr-en.en": "x\n"})
    monkeypatch.setitem(datasets.DATASETS, "wmt14-en-de", _with_digests(datasets.WMT14_EN_DE, wmt_mirror))
    with pytest.raises(DataError, match=r"holds no 'commoncrawl\.de-en\.(de|en)'"):
        list(multi30k_task(tmp_path, dataset="wmt14-en-de", mirror=str(wmt_mirror)).read("train"))


def test_an_archive_member_that_is_a_link_is_refused_not_followed(
        tmp_path: Path, wmt_mirror: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "secret"
    secret.write_text("not for the model\n")
    with tarfile.open(wmt_mirror / "dev.tgz", "w:gz") as tar:
        links = {"dev/newstest2013.en": str(secret), "dev/newstest2013.de": "newstest2013.en"}
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    monkeypatch.setitem(datasets.DATASETS, "wmt14-en-de", _with_digests(datasets.WMT14_EN_DE, wmt_mirror))
    with pytest.raises(DataError, match=r"dev.tgz: refused the member 'dev/newstest2013.(de|en)': it is a "
                                        r"symbolic link"):
        list(multi30k_task(tmp_path, dataset="wmt14-en-de", mirror=str(wmt_mirror)).read("dev"))
    extracted = tmp_path / "cache" / "wmt14-en-de" / "dev.tgz.d"
    assert not any(p.is_file() for p in extracted.rglob("*")) and secret.read_text() == "not for the model\n"
