"""find_ssm_layers on every tiny family, on the meta device (no weights)."""

import pytest
import torch
import transformers

from replayssm import find_ssm_layers
from replayssm.tiny import TINY_FAMILIES, model_class_for, tiny_config

MAMBA2 = ["mamba2", "nemotron_h", "bamba", "falcon_h1", "zamba2", "granitemoehybrid"]
DELTA = {"qwen3_next": "gated_deltanet", "qwen3_5": "gated_deltanet", "qwen3_5_moe": "gated_deltanet",
         "qwen4_exp": "gated_deltanet", "olmo_hybrid": "gated_deltanet", "kimi_linear": "kda",
         "bailing_hybrid": "kda", "glm5_next": "kda"}
MAMBA1 = ["mamba", "falcon_mamba", "jamba", "zamba"]
EXPECTED_COUNT = {"mamba2": 2, "nemotron_h": 2, "bamba": 3, "falcon_h1": 2, "zamba2": 4, "granitemoehybrid": 3,
                  "qwen3_next": 3, "qwen3_5": 3, "qwen3_5_moe": 3, "qwen4_exp": 3, "olmo_hybrid": 3,
                  "kimi_linear": 3, "bailing_hybrid": 3, "glm5_next": 3, "mamba": 2, "falcon_mamba": 2, "jamba": 2, "zamba": 4}


def meta_model(family):
    try:
        config = tiny_config(f"tiny:{family}")
    except Exception as exc:  # family missing from this transformers version
        pytest.skip(f"{family}: {exc}")
    with torch.device("meta"):
        return model_class_for(config)._from_config(config)


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_every_family_on_meta_device(family):
    model = meta_model(family)
    assert all(p.device.type == "meta" for p in model.parameters())
    records = find_ssm_layers(model)
    assert len(records) == EXPECTED_COUNT[family]
    names = [r.name for r in records]
    assert len(set(names)) == len(names)
    for r in records:
        assert model.get_submodule(r.name) is not None
        assert r.state_bytes > 0 and all(v > 0 for v in r.shapes.values())
        assert r.known_class
        if family in MAMBA2:
            assert r.kind == "mamba2" and r.can_rewrite, r.reason
            s = r.shapes
            assert r.state_bytes == s["num_heads"] * s["head_dim"] * s["state_size"] * 4
            assert r.buffer_bytes(16) > 0
        elif family in DELTA:
            assert r.kind == DELTA[family] and r.can_rewrite, r.reason
            assert r.buffer_bytes(16) > 0
        else:
            assert r.kind == "mamba1" and not r.can_rewrite and "not implemented" in r.reason


def test_mamba2_shapes():
    records = find_ssm_layers(meta_model("nemotron_h"))
    assert [r.name for r in records] == ["model.layers.0.mixer", "model.layers.2.mixer"]
    assert records[0].shapes == {"num_heads": 8, "head_dim": 16, "state_size": 16, "n_groups": 2}
    assert records[0].layer_idx == 0 and records[1].layer_idx == 2


def test_unknown_class_with_ssm_structure_is_reported():
    """A remote-code style class (unknown name) with Mamba-2 parameters is found, not rewritten."""

    class CustomSSMMixer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.A_log = torch.nn.Parameter(torch.zeros(4))
            self.dt_bias = torch.nn.Parameter(torch.zeros(4))
            self.D = torch.nn.Parameter(torch.ones(4))
            self.conv1d = torch.nn.Conv1d(8, 8, 4, groups=8)
            self.in_proj = torch.nn.Linear(8, 8)
            self.out_proj = torch.nn.Linear(8, 8)
            self.norm = torch.nn.LayerNorm(8)
            self.layer_idx = 0

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), CustomSSMMixer())
    records = find_ssm_layers(model)
    assert len(records) == 1
    r = records[0]
    assert r.name == "1" and r.kind == "mamba2" and not r.known_class and not r.can_rewrite
    assert "CustomSSMMixer" in r.reason


def test_plain_transformer_has_none():
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert find_ssm_layers(model) == []


# --------------------------------------------------------------------------- recorded layer names in every class
REWRITABLE = MAMBA2 + sorted(DELTA)


def meta_pair(family):
    """(generating model, base model) of a family, both built on the meta device from ONE config object."""
    model = meta_model(family)
    with torch.device("meta"):
        base = transformers.AutoModel.from_config(model.config)
    assert type(base) is not type(model)
    return model, base


@pytest.mark.parametrize("family", REWRITABLE)
def test_recorded_block_applies_to_every_class_built_from_the_config(family):
    """Patching records a block on the shared config; patching another class of the family built
    from that config (base model <-> causal LM / conditional generation) rewrites the same layers."""
    import replayssm

    model, base = meta_pair(family)
    replayssm.patch(model, buffer_len=4)
    replayssm.patch(base)  # reads the block the first patch recorded on the shared config
    from replayssm.config import stack_relative_name
    names = [stack_relative_name(r.name) for r in replayssm.replayssm_report(model)["rewritten"]]
    assert [stack_relative_name(r.name) for r in replayssm.replayssm_report(base)["rewritten"]] == names
    assert base.config.replayssm["buffer_len"] == 4
    # and the other way round, on fresh models
    model, base = meta_pair(family)
    replayssm.patch(base, buffer_len=2)
    replayssm.patch(model)
    assert len(replayssm.replayssm_report(model)["rewritten"]) == len(names)


@pytest.mark.parametrize("family,prefix,base_prefix", [("mamba2", "backbone.", ""), ("qwen3_5", "model.", ""),
                                                       ("glm5_next", "model.language_model.", "language_model.")])
def test_checkpoints_load_patched_in_any_class(family, prefix, base_prefix, tmp_path):
    """A patched causal-LM checkpoint loads patched as the base model, and a patched base-model
    checkpoint as the causal LM; an old (version 1) block with qualified names too."""
    import json

    import replayssm
    from replayssm.tiny import build_tiny_model, tiny_config

    try:
        tiny_config(f"tiny:{family}")
    except Exception as exc:  # family missing from this transformers version
        pytest.skip(f"{family}: {exc}")
    lm = replayssm.patch(build_tiny_model(f"tiny:{family}"), buffer_len=4)
    rewritten = [r.name for r in replayssm.replayssm_report(lm)["rewritten"]]
    assert rewritten and all(n.startswith(prefix) for n in rewritten)
    replayssm.save_pretrained(lm, tmp_path / "lm")
    base = replayssm.patch(transformers.AutoModel.from_pretrained(tmp_path / "lm"))
    assert [r.name for r in replayssm.replayssm_report(base)["rewritten"]] == \
        [base_prefix + n[len(prefix):] for n in rewritten]
    base.save_pretrained(tmp_path / "base")
    again = replayssm.from_pretrained(tmp_path / "base")
    assert [r.name for r in replayssm.replayssm_report(again)["rewritten"]] == rewritten
    # a block written by schema version 1 (names qualified in the class patched then)
    config = json.loads((tmp_path / "lm" / "config.json").read_text())
    config["replayssm"]["schema_version"] = 1
    for entry in config["replayssm"]["layers"]:
        entry["name"] = prefix + entry["name"]
    (tmp_path / "lm" / "config.json").write_text(json.dumps(config))
    old = replayssm.patch(transformers.AutoModel.from_pretrained(tmp_path / "lm"))
    assert len(replayssm.replayssm_report(old)["rewritten"]) == len(rewritten)
