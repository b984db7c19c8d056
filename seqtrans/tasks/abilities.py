"""The optional abilities of the plugin contract, declared in one table.

Each ability is a runtime-checkable protocol of :mod:`seqtrans.tasks.protocol` that one
object of a plugin may have: the **codec** (what ``build_vocabulary`` returns), the
**task** (an instance of the task class), the **task class** itself, or the task's
**config** (its ``data`` section). The engine looks for an ability on that object only,
with ``isinstance``; the same methods on another object are ignored, which is why
:func:`seqtrans.tasks.contract.check_task` reads this table to find abilities put on
the wrong object. The plugin reference (docs/plugin-contract.md) shows the table as
``python docs/generate.py`` writes it from :func:`markdown_table`, each row linked to
the ability's section in docs/plugin-abilities.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from seqtrans.tasks.protocol import (
    CacheDirectory,
    Constraining,
    DataDigest,
    ModelExtending,
    Multilingual,
    SegmentationSampling,
    SourceFormatting,
    TargetParsing,
    TargetPrefixing,
    TextForm,
    TokenWords,
    TrainingFiles,
    Upgrading,
)

__all__ = ["ABILITIES", "OBJECTS", "Ability", "attached_to", "markdown_table"]

#: The objects of a plugin an ability may attach to.
OBJECTS = ("codec", "task", "task class", "config")


@dataclass(frozen=True)
class Ability:
    """One optional ability: its protocol, the object it attaches to (one of
    :data:`OBJECTS`), the contract version that added it (the seqtrans minor version,
    ``"0.2"``) and what the engine does with it, in a phrase."""

    protocol: type
    attaches_to: str
    since: str
    used_for: str

    @property
    def name(self) -> str:
        return self.protocol.__name__

    @property
    def members(self) -> tuple[str, ...]:
        """The names the protocol declares: its methods, properties and attributes."""
        declared = {*vars(self.protocol), *getattr(self.protocol, "__annotations__", {})}
        return tuple(sorted(n for n in declared if not n.startswith("_")))


#: Every optional ability, in the order the reference lists them. Versions follow
#: CHANGELOG.md's "Plugin contract" entries; an ability it does not list came with 0.1.
ABILITIES: tuple[Ability, ...] = (
    Ability(Constraining, "codec", "0.1", "restricts the next tokens in search (`decode.constrained`)"),
    Ability(SegmentationSampling, "codec", "0.1", "sampled segmentations (`train.subword_sampling`)"),
    Ability(ModelExtending, "codec", "0.1", "model-side parts of the task's own (`ModelExtension`)"),
    Ability(Multilingual, "codec", "0.2",
            "languages as settings (`decode.source_lang`, `decode.target_lang`)"),
    Ability(TargetPrefixing, "codec", "0.2", "tokens every output starts with, forced"),
    Ability(TokenWords, "codec", "0.1", "the word of each token, for `predict --alignments`"),
    Ability(DataDigest, "task", "0.1", "finds prepared data without reading the data"),
    Ability(TargetParsing, "task", "0.1", "a target read from text (`seqtrans score`, banned phrases)"),
    Ability(SourceFormatting, "task", "0.1", "a source written as input text (`evaluate --stream`)"),
    Ability(TrainingFiles, "task", "0.1", "training pairs from two files (`seqtrans distill`)"),
    Ability(TextForm, "task", "0.2", "a run that keeps a text-to-text model's codec (`run --init`)"),
    Ability(Upgrading, "task class", "0.1", "converts runs saved by earlier plugin versions"),
    Ability(CacheDirectory, "config", "0.2", "`data.cache_dir`: where a run keeps what it prepares"),
)


def attached_to(place: str) -> tuple[Ability, ...]:
    """The abilities of one object of :data:`OBJECTS`."""
    if place not in OBJECTS:
        raise ValueError(f"an ability attaches to one of {', '.join(OBJECTS)}, not {place!r}")
    return tuple(a for a in ABILITIES if a.attaches_to == place)


def markdown_table() -> str:
    """The table of abilities as the plugin reference shows it."""
    rows = [f"| [`{a.name}`](plugin-abilities.md#{a.name.lower()}) | {a.attaches_to} | {a.since} | "
            f"{', '.join(f'`{m}`' for m in a.members)} | {a.used_for} |" for a in ABILITIES]
    header = "| ability | attaches to | since | members | what the engine does with it |"
    return "\n".join([header, "|---|---|---|---|---|", *rows]) + "\n"
