"""check_task catches the ways a plugin can break the contract."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from fake_plugins.lines_task import LinesCodec, LinesConfig, LinesTask
from seqtrans.tasks import Example, Skipped
from seqtrans.tasks.abilities import ABILITIES, OBJECTS, attached_to, markdown_table
from seqtrans.tasks.contract import ContractError, ContractWarning, check_task, contract_names


@pytest.fixture
def data(tmp_path: Path) -> LinesConfig:
    for split in ("train", "dev", "test"):
        (tmp_path / f"{split}.tsv").write_text("a b\tb a\nc\tc\nb c a\ta c b\n")
    return LinesConfig(**{split: str(tmp_path / f"{split}.tsv") for split in ("train", "dev", "test")})


def test_a_task_that_keeps_the_contract_passes(tmp_path: Path, data: LinesConfig) -> None:
    assert check_task(LinesTask(data), tmp_path / "vocab") == {"exact_match": 1.0}


def test_a_metric_is_higher_is_better_unless_the_task_says_lower() -> None:
    from seqtrans.tasks.protocol import metric_mode

    class ErrorRate(LinesTask):
        metric_mode = "min"

    assert metric_mode(LinesTask) == "max" and metric_mode(ErrorRate) == "min"
    with pytest.raises(ValueError, match="'max'.*'min'"):
        metric_mode(LowestIsBest)


@dataclasses.dataclass(frozen=True)
class Unpicklable(LinesCodec):
    tokenize: Any = lambda text: text.split()


class Sampling(LinesCodec):
    calls = 0

    def sample_source_tokens(self, sources: Sequence[str], alpha: float, seed: int) -> list[list[str]]:
        Sampling.calls += 1  # a different sample every call, whatever the seed
        return [s.split()[Sampling.calls % 2:] for s in sources]


def _with_codec(codec_cls: type[LinesCodec]) -> type[LinesTask]:
    class Task(LinesTask):
        def build_vocabulary(self, directory: Path, train: Iterable[Example[str, str]]) -> LinesCodec:
            return codec_cls(super().build_vocabulary(directory, train).vocabularies)

        def load_vocabulary(self, directory: Path) -> LinesCodec:
            return codec_cls(super().load_vocabulary(directory).vocabularies)

    return Task


class AnySplit(LinesTask):
    def read(self, split: str) -> Iterator[Example[str, str]]:
        return super().read(split if split in ("train", "dev", "test") else "test")


class LowestIsBest(LinesTask):
    metric_mode = "lowest"


@pytest.mark.parametrize("task_cls, problem", [
    (LowestIsBest, "metric_mode must be one of max, min"),
    (_with_codec(Unpicklable), "the codec does not pickle"),
    (_with_codec(Sampling), "must repeat its samples for the same seed"),
    (AnySplit, "read\\(\\) of an unknown split must raise UsageError"),
])
def test_a_broken_task_is_named_by_its_problem(tmp_path: Path, data: LinesConfig, task_cls: type[LinesTask],
                                               problem: str) -> None:
    with pytest.raises(ContractError, match=problem):
        check_task(task_cls(data), tmp_path / "vocab")


class SkipsAll(LinesTask):
    def read(self, split: str) -> Iterator[Example[str, str] | Skipped]:
        for ex in super().read(split):
            yield Skipped(ex.origin, "too short") if split == "test" else ex


def test_an_empty_split_is_named_with_what_to_do(tmp_path: Path, data: LinesConfig) -> None:
    with pytest.raises(ContractError, match=r"split 'test' yields no examples: the task left out all 3 it "
                                            r"read \(too short\)"):
        check_task(SkipsAll(data), tmp_path / "vocab")
    Path(data.dev).write_text("")
    with pytest.raises(ContractError, match="split 'dev' yields no examples: it is empty; check_task reads "
                                            "every split: configure the task with a small fixture for each"):
        check_task(LinesTask(data), tmp_path / "vocab")


def test_a_split_that_cannot_be_read_is_named(tmp_path: Path, data: LinesConfig) -> None:
    missing = dataclasses.replace(data, test=str(tmp_path / "nowhere.tsv"))
    with pytest.raises(ContractError, match=r"split 'test' cannot be read \(FileNotFoundError: .*nowhere"):
        check_task(LinesTask(missing), tmp_path / "vocab")


def test_one_small_fixture_may_serve_every_split(tmp_path: Path) -> None:
    (tmp_path / "all.tsv").write_text("a\ta\n")
    one = LinesConfig(**{split: str(tmp_path / "all.tsv") for split in ("train", "dev", "test")})
    assert check_task(LinesTask(one), tmp_path / "vocab") == {"exact_match": 1.0}


def test_a_misspelt_contract_name_is_warned_about(tmp_path: Path, data: LinesConfig) -> None:
    class Misspelt(LinesTask):
        metric_mdoe = "min"  # would be ignored: the metric stays higher-is-better
        decode_defualts: dict[str, Any] = {}  # noqa: RUF012
        source_format = "words"  # a name of its own, not a misspelling

    with pytest.warns(ContractWarning) as caught:
        check_task(Misspelt(data), tmp_path / "vocab")
    assert sorted(str(w.message) for w in caught) == [
        "Misspelt.decode_defualts is no name of the plugin contract and is ignored; did you mean 'defaults'?",
        "Misspelt.metric_mdoe is no name of the plugin contract and is ignored; did you mean 'metric_mode'?"]


def test_the_names_of_every_protocol_are_known() -> None:
    import typing

    from seqtrans.tasks import protocol

    declared = {v for v in vars(protocol).values() if isinstance(v, type) and typing.Protocol in v.__mro__
                and v is not typing.Protocol}
    assert declared == {*protocol.REQUIRED, *(ability.protocol for ability in ABILITIES)}
    assert len({ability.protocol for ability in ABILITIES}) == len(ABILITIES)
    assert {ability.attaches_to for ability in ABILITIES} == set(OBJECTS)
    assert {"cache_dir", "train_digest", "metric_mode", "stream_unit", "score"} <= contract_names()


class DigestOnTheCodec(LinesCodec):
    def train_digest(self) -> str:  # an ability of the task: the engine never asks a codec
        return "abc"


class LanguagesOnTheTask(LinesTask):
    languages = ("de", "en")  # Multilingual is an ability of the codec

    def with_languages(self, source: str | None, target: str | None) -> Any:
        return self


def test_an_ability_on_the_wrong_object_is_warned_about(tmp_path: Path, data: LinesConfig) -> None:
    with pytest.warns(ContractWarning) as caught:
        check_task(_with_codec(DigestOnTheCodec)(data), tmp_path / "a")
    assert [str(w.message) for w in caught] == [
        "DigestOnTheCodec (codec) has train_digest, the DataDigest ability of the task: the engine looks "
        "for it on the task only and ignores it here"]
    with pytest.warns(ContractWarning, match=r"LanguagesOnTheTask \(task\) has languages, with_languages, "
                                             "the Multilingual ability of the codec"):
        check_task(LanguagesOnTheTask(data), tmp_path / "b")


def test_the_abilities_table_names_the_object_each_attaches_to() -> None:
    assert [a.name for a in attached_to("config")] == ["CacheDirectory"]
    assert [a.name for a in attached_to("task class")] == ["Upgrading"]
    with pytest.raises(ValueError, match="not 'model'"):
        attached_to("model")
    table = markdown_table().splitlines()
    assert len(table) == 2 + len(ABILITIES)
    assert ("| [`Multilingual`](plugin-abilities.md#multilingual) | codec | 0.2 | "
            "`languages`, `with_languages` |") in table[5]
