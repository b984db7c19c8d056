"""Run configuration: the schema (:mod:`.schema`, made of one module per section:
:mod:`.model`, :mod:`.train`, :mod:`.decode`; every default once, with its help text),
value checking (:mod:`.values`) and resolution in layers (:mod:`.layers`).

This package imports no task: a task's configuration is resolved by
:func:`seqtrans.resolve_config`, a layer above."""

from seqtrans.config.layers import (
    describe,
    from_dict,
    load_file,
    markdown_table,
    merge,
    parse_overrides,
    preset_names,
    resolve,
    same_settings,
    to_dict,
)
from seqtrans.config.schema import (
    CROSS_MECHANISMS,
    PRECISIONS,
    PRESETS,
    SELF_MECHANISMS,
    DecodeConfig,
    Mechanism,
    ModelConfig,
    RunConfig,
    TrainConfig,
    option,
)

__all__ = ["CROSS_MECHANISMS", "PRECISIONS", "PRESETS", "SELF_MECHANISMS", "DecodeConfig", "Mechanism",
           "ModelConfig", "RunConfig", "TrainConfig", "describe", "from_dict", "load_file", "markdown_table",
           "merge", "option", "parse_overrides", "preset_names", "resolve", "same_settings",
           "to_dict"]
