"""Named datasets: where their files are published, their sha256, and which files pair up.

Files are fetched with :func:`seqtrans.plugin.fetch` (cache, mirror, verification);
members of archives are extracted once with :func:`seqtrans.plugin.extract` into the
cache beside the archive, with a marker written last, so an interrupted extraction is
simply done again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from seqtrans.plugin import ConfigError, cache_dir, extract, fetch, file_name
from seqtrans_translation.readers import TextFile

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Remote:
    """A published file and the sha256 it must have."""

    url: str
    sha256: str


@dataclass(frozen=True)
class Side:
    """One language's file of a corpus: the remote file itself, or a member of it (an archive)."""

    remote: Remote
    member: str = ""
    sgm: bool = False


Corpus = Mapping[str, Side]  # language -> its file; all languages' files are line-aligned


@dataclass(frozen=True)
class Dataset:
    name: str
    languages: tuple[str, str]
    train: Sequence[Corpus]
    dev: Sequence[Corpus]
    tests: Mapping[str, Sequence[Corpus]]
    default_test: str
    about: str


# ------------------------------------------------------------------------- Multi30k

# The official repository's raw files (task 1), pinned to a commit so that the digests
# stay valid. The digests were computed from byte-identical copies of these files.
_M30K = "https://raw.githubusercontent.com/multi30k/dataset/a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw/"
_M30K_SHA256 = {
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_mscoco.en.gz": "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58",
    "test_2017_mscoco.de.gz": "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338",
    "test_2018_flickr.en.gz": "ef4f4844037d4c5dea75c9a8ed5fd78905967a26f67c255e230cc9780032654d",
    "test_2018_flickr.de.gz": "ddd0130c7d97482dc5197a02141dae8dd79f20f03586c480d675c09a32daf608",
}


def _m30k(stem: str) -> Corpus:
    return {lang: Side(Remote(_M30K + f"{stem}.{lang}.gz", _M30K_SHA256[f"{stem}.{lang}.gz"]))
            for lang in ("en", "de")}


MULTI30K = Dataset(
    name="multi30k",
    languages=("en", "de"),
    train=[_m30k("train")],
    dev=[_m30k("val")],
    tests={stem: [_m30k(stem)] for stem in
           ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr")},
    default_test="test_2016_flickr",
    about="Multi30k task 1 (Elliott et al. 2016): 29,000 training, 1,014 validation pairs",
)

# ------------------------------------------------------------------------- WMT 2014 en-de

# The WMT 2014 English-German training corpora as the common preparation scripts fetch
# them (Europarl v7, Common Crawl, News Commentary v9), newstest2013 for development and
# newstest2014 (all 3,003 segments, the set sacreBLEU calls wmt14/full) for test; the two
# test sets are read from the WMT development archive that holds both. The sha256
# digests are those published by TensorFlow Datasets for these exact URLs, in
# tensorflow/datasets, tensorflow_datasets/url_checksums/wmt14_translate.txt (all four)
# and wmt_t2t_translate.txt (the same digests for Europarl, Common Crawl and dev.tgz).
_EUROPARL = Remote("http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
                   "0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7")
_COMMONCRAWL = Remote("http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
                      "c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5")
_NEWS_COMMENTARY = Remote("http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz",
                          "cb8953f292298e6877ae433c98912b927cb0766b303f4540512ddd286c748485")
_DEV = Remote("http://data.statmt.org/wmt19/translation-task/dev.tgz",
              "7a7deccf82ebb05ba508dba5eb21356492224e8f630ec4f992132b029b4b25e7")

WMT14_EN_DE = Dataset(
    name="wmt14-en-de",
    languages=("en", "de"),
    train=[
        {lang: Side(_EUROPARL, f"training/europarl-v7.de-en.{lang}") for lang in ("en", "de")},
        {lang: Side(_COMMONCRAWL, f"commoncrawl.de-en.{lang}") for lang in ("en", "de")},
        {lang: Side(_NEWS_COMMENTARY, f"training/news-commentary-v9.de-en.{lang}") for lang in ("en", "de")},
    ],
    dev=[{lang: Side(_DEV, f"dev/newstest2013.{lang}") for lang in ("en", "de")}],
    # newstest2014 is one set of segments for both directions: the German side from
    # the de-en source file, the English side from its reference (same text as
    # sacreBLEU's en-de source and reference).
    tests={"newstest2014": [{"de": Side(_DEV, "dev/newstest2014-deen-src.de.sgm", sgm=True),
                             "en": Side(_DEV, "dev/newstest2014-deen-ref.en.sgm", sgm=True)}]},
    default_test="newstest2014",
    about="WMT 2014 English-German (Vaswani et al. 2017): about 4.5 million training pairs",
)

DATASETS: dict[str, Dataset] = {d.name: d for d in (MULTI30K, WMT14_EN_DE)}


def get(name: str) -> Dataset:
    if name not in DATASETS:
        raise ConfigError("data.dataset", f"unknown dataset '{name}'; choose one of "
                          f"{', '.join(DATASETS)}, or 'none' with local files")
    return DATASETS[name]


# ------------------------------------------------------------------------- fetching


@dataclass(frozen=True)
class Where:
    """Where downloads go and come from: the cache directory and an optional mirror."""

    cache: str = ""
    mirror: str = ""


def corpus_files(dataset: Dataset, corpus: Corpus, languages: tuple[str, str],
                 where: Where) -> tuple[TextFile, TextFile]:
    """The local (source, target) files of one corpus, fetched and extracted as needed."""
    return _local(dataset, corpus[languages[0]], where), _local(dataset, corpus[languages[1]], where)


def _local(dataset: Dataset, side: Side, where: Where) -> TextFile:
    if not side.member:
        path = fetch(side.remote.url, sha256=side.remote.sha256, cache=where.cache or None,
                              subdir=dataset.name, mirror=where.mirror or None)
        return TextFile(path, sgm=side.sgm)
    members = sorted({s.member for s in _sides(dataset) if s.remote == side.remote})
    extracted = _extract(dataset, side.remote, members, where)
    return TextFile(extracted[side.member], sgm=side.sgm)


def _sides(dataset: Dataset) -> list[Side]:
    corpora = [*dataset.train, *dataset.dev, *(c for cs in dataset.tests.values() for c in cs)]
    return [side for corpus in corpora for side in corpus.values()]


def _extract(dataset: Dataset, remote: Remote, members: Sequence[str], where: Where) -> dict[str, Path]:
    """Extract ``members`` of an archive once; later calls find them without the archive."""
    root = cache_dir(where.cache or None) / dataset.name / (file_name(remote.url) + ".d")
    marker = root / ".complete"
    wanted = remote.sha256 + "\n" + "\n".join(members) + "\n"
    if marker.is_file() and marker.read_text() == wanted:
        paths = {m: root / m for m in members}
        if all(p.is_file() for p in paths.values()):
            return paths
    archive = fetch(remote.url, sha256=remote.sha256, cache=where.cache or None,
                             subdir=dataset.name, mirror=where.mirror or None)
    log.info("extracting %d file(s) from %s", len(members), archive)
    marker.unlink(missing_ok=True)
    paths = extract(archive, members, root)  # refuses links and names that leave root
    marker.write_text(wanted)
    return paths
