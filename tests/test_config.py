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
                                            ("float32", "fp32"), (None, None), ("FP8", "fp8"), ("e4m3", "fp8"),
                                            (torch.float8_e4m3fn, "fp8"), ("int8", "int8"), (torch.int8, "int8")])
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
        (dict(state_dtype="int4"), "state_dtype"),
        (dict(state_dtype=torch.int32), "state_dtype"),
        (dict(state_rounding="up"), "state_rounding"),
        (dict(state_rounding=1), "state_rounding"),
        (dict(state_seed=-1), "state_seed"),
        (dict(state_seed=2**32), "state_seed"),
        (dict(state_seed="7"), "state_seed"),
        (dict(state_rounding="stochastic"), "state_rounding"),
        (dict(state_rounding="stochastic", state_dtype="fp32"), "state_rounding"),
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


# --------------------------------------------------------------------------- one vocabulary for Python and CLI
def cli_options(monkeypatch, *args):
    """The keyword arguments the CLI's ``convert`` passes to the library for ``args``, or its exit code."""
    import replayssm.conversion as conversion
    from replayssm.cli.main import main

    seen = {}

    def fake_convert(model, out_dir, **kwargs):
        seen.update(kwargs)
        raise SystemExit(0)  # stop before any work

    monkeypatch.setattr(conversion, "convert", fake_convert)
    try:
        code = main(["convert", "tiny:mamba2", "unused-out", *args])
    except SystemExit:
        return seen
    return code


@pytest.mark.parametrize("option,field,spellings,canonical", [
    ("--backend", "backend", ["triton", "TRITON", "Triton"], "triton"),
    ("--backend", "backend", ["torch", "TORCH"], "torch"),
    ("--state-dtype", "state_dtype", ["bf16", "bfloat16", "BF16", "torch.bfloat16"], "bf16"),
    ("--state-dtype", "state_dtype", ["fp32", "float32", "float"], "fp32"),
    ("--state-dtype", "state_dtype", ["fp16", "float16", "half"], "fp16"),
    ("--state-dtype", "state_dtype", ["fp8", "e4m3", "float8_e4m3fn"], "fp8"),
    ("--state-dtype", "state_dtype", ["int8", "INT8"], "int8"),
    ("--state-rounding", "state_rounding", ["stochastic", "SR", "Stochastic"], "stochastic"),
    ("--state-rounding", "state_rounding", ["nearest", "rtn"], "nearest"),
])
def test_python_and_cli_accept_the_same_spellings(monkeypatch, option, field, spellings, canonical):
    extra = {"state_dtype": "bf16"} if field == "state_rounding" else {}  # stochastic needs a 16/8-bit state
    for spelling in spellings:
        assert getattr(ReplaySSMConfig(**{field: spelling}, **extra), field) == canonical
        assert cli_options(monkeypatch, option, spelling)[field] == canonical, spelling


@pytest.mark.parametrize("option,field,value", [
    ("--backend", "backend", "cuda"), ("--backend", "backend", "tritonn"),
    ("--state-dtype", "state_dtype", "int4"), ("--state-dtype", "state_dtype", "fp64"),
    ("--state-rounding", "state_rounding", "up"), ("--state-seed", "state_seed", "-3"),
    ("--buffer-len", "buffer_len", "0"), ("--buffer-len", "buffer_len", "257"),
])
def test_python_and_cli_refuse_the_same_values(monkeypatch, capsys, option, field, value):
    with pytest.raises(ConfigError, match=field):
        ReplaySSMConfig(**{field: int(value) if field in ("buffer_len", "state_seed") else value})
    assert cli_options(monkeypatch, option, value) == 2
    assert field in capsys.readouterr().err


def test_validation_dtype_and_device_spellings(monkeypatch):
    from replayssm.config import parse_device, parse_model_dtype

    for spelling in ("bf16", "bfloat16", "BF16"):
        assert parse_model_dtype(spelling) == "bf16"
        assert cli_options(monkeypatch, "--dtype", spelling)["dtype"] == "bf16"
    assert parse_model_dtype(torch.float16) == "fp16" and parse_model_dtype(None) == "auto"
    assert cli_options(monkeypatch, "--device", "CUDA:1")["device"] == "cuda:1" == parse_device("CUDA:1")
    for bad in ("int4", "fp64", "int8", "fp8"):  # 8-bit: checkpoints only, not model weights
        with pytest.raises(ConfigError, match="dtype"):
            parse_model_dtype(bad)
        assert cli_options(monkeypatch, "--dtype", bad) == 2
    with pytest.raises(ConfigError, match="device"):
        parse_device("gpu")
    assert cli_options(monkeypatch, "--device", "gpu") == 2


@pytest.mark.parametrize("value", ["no", "false", 0, 1, None])
def test_strict_must_be_a_bool(value):
    """strict="no" is truthy: accepting it would silently mean the opposite of what was written."""
    with pytest.raises(ConfigError, match="strict must be True or False"):
        ReplaySSMConfig(strict=value)


def test_patch_validates_through_the_config():
    import replayssm
    from replayssm.tiny import build_tiny_model

    model = build_tiny_model("tiny:mamba2")
    with pytest.raises(ConfigError, match="strict"):
        replayssm.patch(model, strict="no")
    assert not replayssm.is_patched(model)
    replayssm.patch(model, backend="TORCH", state_dtype="bfloat16", buffer_len=4)
    block = model.config.replayssm
    assert block["backend"] == "torch" and block["state_dtype"] == "bf16"


def test_constants_are_defined_once():
    """The CLI's defaults and choices are the library's (no second copy to drift)."""
    import inspect

    from replayssm.cli.cmd_convert import convert_command
    from replayssm.config import DEFAULT_BUFFER_LEN, Backend, StateDtype

    params = inspect.signature(convert_command).parameters
    assert params["buffer_len"].default.default == DEFAULT_BUFFER_LEN == ReplaySSMConfig().buffer_len
    assert params["backend"].default.metavar == "[" + "|".join(b.value for b in Backend) + "]"
    assert params["state_dtype"].default.metavar == "[" + "|".join(d.value for d in StateDtype) + "]"


# --------------------------------------------------------------------------- layer names in the block
def test_block_names_layers_from_the_decoder_stack():
    from replayssm.config import block_layer_names, stack_relative_name

    assert stack_relative_name("model.language_model.layers.3.linear_attn") == "layers.3.linear_attn"
    assert stack_relative_name("backbone.layers.0.mixer") == "layers.0.mixer"
    assert stack_relative_name("layers.1.mamba_decoder.mamba") == "layers.1.mamba_decoder.mamba"
    assert stack_relative_name("mixer") == "mixer"
    block = ReplaySSMConfig().to_block([{"name": "model.layers.2.mamba", "kind": "mamba2"}])
    assert block["layers"] == [{"name": "layers.2.mamba", "kind": "mamba2"}]
    cfg = ReplaySSMConfig.from_block(block)
    for name in ("layers.2.mamba", "model.layers.2.mamba", "model.language_model.layers.2.mamba"):
        assert cfg.selects(name), name
    assert not cfg.selects("model.layers.20.mamba") and not cfg.selects("model.layers.2.mamba.x")
    assert block_layer_names(block) == ["layers.2.mamba"]


def test_version_1_blocks_with_qualified_names_are_read():
    v1 = {"schema_version": 1, "buffer_len": 8, "state_dtype": "fp32", "backend": "auto",
          "layers": [{"name": "model.layers.0.mixer", "kind": "mamba2"}]}
    cfg = ReplaySSMConfig.from_block(v1)
    assert cfg.buffer_len == 8
    assert cfg.selects("layers.0.mixer") and cfg.selects("model.layers.0.mixer")
    assert cfg.selects("backbone.layers.0.mixer") and not cfg.selects("model.layers.1.mixer")


def test_backend_vocabulary_matches_the_kernels():
    """The CLI-side enum (no torch import) and the kernels' dispatcher accept the same names."""
    from replayssm.config import Backend
    from replayssm.kernels.backend import BACKENDS

    assert tuple(b.value for b in Backend) == BACKENDS


def test_quantized_state_block_round_trip():
    cfg = ReplaySSMConfig(state_dtype="e4m3", state_rounding="sr", state_seed=9)
    block = cfg.to_block([{"name": "layers.0.mixer", "kind": "mamba2"}])
    assert (block["state_dtype"], block["state_rounding"], block["state_seed"]) == ("fp8", "stochastic", 9)
    again = ReplaySSMConfig.from_block(block)
    assert (again.state_dtype, again.state_rounding, again.state_seed) == ("fp8", "stochastic", 9)
    assert again.torch_state_dtype == torch.float8_e4m3fn
    old = {k: v for k, v in block.items() if k not in ("state_rounding", "state_seed")}
    assert ReplaySSMConfig.from_block(old).state_rounding == "nearest"  # blocks written before the option


def test_stochastic_rounding_of_an_fp32_checkpoint_is_one_clear_error(monkeypatch, capsys):
    with pytest.raises(ConfigError) as info:
        ReplaySSMConfig(state_rounding="stochastic")
    message = str(info.value)
    assert "\n" not in message and "below fp32" in message and "got state_dtype='fp32'" in message
    assert ReplaySSMConfig(state_rounding="stochastic", state_dtype="bf16").state_rounding == "stochastic"
