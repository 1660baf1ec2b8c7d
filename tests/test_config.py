"""ReplaySSMConfig validation and its config.json block."""

import pytest
import torch

from replayssm import ConfigError, ReplaySSMConfig, SchemaVersionError
from replayssm.config import SCHEMA_VERSION


def test_defaults():
    cfg = ReplaySSMConfig()
    assert cfg.buffer_len == 16 and cfg.state_dtype is None and cfg.layers is None and cfg.backend == "auto"
    assert cfg.schema_version == SCHEMA_VERSION


@pytest.mark.parametrize("value,expected", [("bf16", "bf16"), ("bfloat16", "bf16"), (torch.float16, "fp16"),
                                            ("float32", "fp32"), (None, None)])
def test_state_dtype_aliases(value, expected):
    assert ReplaySSMConfig(state_dtype=value).state_dtype == expected


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(buffer_len=0), "buffer_len"),
        (dict(buffer_len=-3), "buffer_len"),
        (dict(buffer_len=2.5), "buffer_len"),
        (dict(buffer_len=True), "buffer_len"),
        (dict(buffer_len=100000), "buffer_len"),
        (dict(state_dtype="int8"), "state_dtype"),
        (dict(state_dtype=torch.int32), "state_dtype"),
        (dict(backend="cuda"), "backend"),
        (dict(layers=[]), "layers"),
        (dict(layers=["model.layers.(0"]), "regular expression"),
        (dict(layers=[3]), "layers"),
    ],
)
def test_invalid_values_name_the_field(kwargs, needle):
    with pytest.raises(ConfigError) as info:
        ReplaySSMConfig(**kwargs)
    message = str(info.value)
    assert needle in message
    assert "got" in message  # says what was found


def test_layer_selection_by_name_and_regex():
    cfg = ReplaySSMConfig(layers=["model.layers.0.mamba", r"model\.layers\.[23]\..*"])
    assert cfg.selects("model.layers.0.mamba")
    assert cfg.selects("model.layers.2.mamba")
    assert not cfg.selects("model.layers.1.mamba")
    assert ReplaySSMConfig(layers="backbone.layers.1.mixer").layers == ("backbone.layers.1.mixer",)


def test_block_round_trip():
    cfg = ReplaySSMConfig(buffer_len=8, state_dtype="bf16")
    block = cfg.to_block([{"name": "a.b", "kind": "mamba2"}])
    assert block["schema_version"] == SCHEMA_VERSION and block["buffer_len"] == 8 and block["state_dtype"] == "bf16"
    again = ReplaySSMConfig.from_block(block)
    assert again.buffer_len == 8 and again.state_dtype == "bf16" and again.selects("a.b") and not again.selects("a.c")


def test_newer_schema_refused():
    block = ReplaySSMConfig().to_block([])
    block["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(SchemaVersionError, match="schema version"):
        ReplaySSMConfig.from_block(block)
    with pytest.raises(ConfigError):
        ReplaySSMConfig.from_block({"buffer_len": 4})
