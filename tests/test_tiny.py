"""Built-in tiny checkpoints are real, deterministic HF checkpoint directories."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from replayssm import ModelSpecError
from replayssm.tiny import TINY_FAMILIES, build_tiny_model, materialize_tiny, tiny_family


def test_materialize_writes_a_checkpoint_once(tmp_path):
    path = materialize_tiny("tiny:mamba2", root=tmp_path)
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "mamba2"
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert materialize_tiny("tiny:mamba2", root=tmp_path) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_deterministic_weights(tmp_path):
    a = load_file(materialize_tiny("tiny:nemotron_h", root=tmp_path / "a") / "model.safetensors")
    b = load_file(materialize_tiny("tiny:nemotron_h", root=tmp_path / "b") / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_loads_with_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    path = materialize_tiny("tiny:bamba", root=tmp_path)
    model = AutoModelForCausalLM.from_pretrained(path)
    ref = build_tiny_model("tiny:bamba")
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), ref.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)


def test_slow_decays_give_memory():
    model = build_tiny_model("tiny:mamba2")
    mixer = model.backbone.layers[0].mixer
    A = -torch.exp(mixer.A_log.float())
    dt = torch.nn.functional.softplus(mixer.dt_bias.float())
    decay = torch.exp(A * dt)
    assert decay.min() > 0.85  # tens of tokens of memory per head


def test_unknown_family():
    with pytest.raises(ModelSpecError, match="tiny:"):
        tiny_family("tiny:gpt2")
    assert set(TINY_FAMILIES) >= {"mamba2", "nemotron_h", "bamba", "falcon_h1", "zamba2", "granitemoehybrid",
                                  "qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid", "kimi_linear",
                                  "bailing_hybrid", "mamba", "falcon_mamba", "jamba"}


def test_checkpoint_directory_holds_only_the_checkpoint(tmp_path):
    """The cache's bookkeeping lives beside the directory, so converting it copies nothing of ours."""
    path = materialize_tiny("tiny:mamba2", root=tmp_path)
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    assert json.loads((path / "config.json").read_text())["dtype"] == "float32"


@pytest.mark.parametrize("damage", ["flip-data", "truncate", "delete-config", "delete-weights"])
def test_damaged_entry_is_rebuilt(tmp_path, damage):
    path = materialize_tiny("tiny:mamba2", root=tmp_path)
    good = {p.name: p.read_bytes() for p in path.iterdir()}
    weights = path / "model.safetensors"
    if damage == "flip-data":
        data = bytearray(weights.read_bytes())
        data[-100] ^= 0xFF  # inside the tensor data: the header and size still check out
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        os.truncate(weights, weights.stat().st_size // 2)
    elif damage == "delete-config":
        (path / "config.json").unlink()
    else:
        weights.unlink()
    assert materialize_tiny("tiny:mamba2", root=tmp_path) == path
    assert {p.name: p.read_bytes() for p in path.iterdir()} == good
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, path.name + ".manifest.json"]


def test_unwritable_cache_is_a_usage_error_naming_the_variable(tmp_path, monkeypatch, capsys):
    from replayssm import CacheError
    from replayssm.cli.main import main

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("REPLAYSSM_CACHE", str(blocker))
    with pytest.raises(CacheError, match="cannot write the tiny-model cache") as info:
        materialize_tiny("tiny:mamba2")
    assert "REPLAYSSM_CACHE" in info.value.hint and str(blocker) in info.value.hint
    assert main(["convert", "tiny:mamba2", str(tmp_path / "out"), "--no-validate"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "unexpected" not in err and "REPLAYSSM_CACHE" in err


def test_damaged_entry_in_a_read_only_cache_names_the_directory(tmp_path, monkeypatch):
    import tempfile

    from replayssm import CacheError

    path = materialize_tiny("tiny:mamba2", root=tmp_path)
    (path / "config.json").write_text("{}")

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    with pytest.raises(CacheError, match="damaged and cannot be rebuilt") as info:
        materialize_tiny("tiny:mamba2", root=tmp_path)
    assert f"delete {path}" in info.value.hint
