"""find_ssm_layers on every tiny family, on the meta device (no weights)."""

import pytest
import torch
import transformers

from replayssm import find_ssm_layers
from replayssm.patches.kinds import KINDS, MAMBA2
from replayssm.tiny import TINY_FAMILIES, model_class_for, tiny_config

def meta_model(family):
    try:
        config = tiny_config(f"tiny:{family}")
    except Exception as exc:  # family missing from this transformers version
        pytest.skip(f"{family}: {exc}")
    with torch.device("meta"):
        return model_class_for(config)._from_config(config)


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_every_family_on_meta_device(family):
    """Each family's layers are found, of the kind its declaration names, rewritable where that
    kind has a replay mixin and reported as not implemented otherwise."""
    declared = TINY_FAMILIES[family]
    kind = KINDS[declared.kind]
    model = meta_model(family)
    assert all(p.device.type == "meta" for p in model.parameters())
    records = find_ssm_layers(model)
    assert len(records) == declared.ssm_layers
    names = [r.name for r in records]
    assert len(set(names)) == len(names)
    for r in records:
        assert model.get_submodule(r.name) is not None
        assert r.state_bytes > 0 and all(v > 0 for v in r.shapes.values())
        assert r.known_class
        assert r.kind == kind.name
        if kind.mixin is not None:
            assert r.can_rewrite, r.reason
            assert r.buffer_bytes(16) > 0
        else:
            assert not r.can_rewrite and "not implemented" in r.reason
        if kind is MAMBA2:
            s = r.shapes
            assert r.state_bytes == s["num_heads"] * s["head_dim"] * s["state_size"] * 4


@pytest.mark.parametrize("family,state,buffer", [
    # mamba2: H*P*N fp32 state; per step x (H*P) and B (G*N) in act bytes, dt (H) fp32
    ("nemotron_h", 8 * 16 * 16 * 4, 16 * (8 * 16 * 2 + 8 * 4 + 2 * 16 * 2)),
    # gated_deltanet: Hv*Dk*Dv fp32 state; per step u (Hv*Dv) and k (Hk*Dk) in act bytes, g (Hv) fp32
    ("qwen3_5", 4 * 16 * 16 * 4, 16 * (4 * 16 * 2 + 2 * 16 * 2 + 4 * 4)),
    # kda: H*D*D fp32 state; per step u and k (H*D) in act bytes, g (H*D) fp32
    ("kimi_linear", 4 * 16 * 16 * 4, 16 * 4 * 16 * (2 * 2 + 4)),
])
def test_state_and_buffer_bytes(family, state, buffer):
    """Sizes per sequence against hand arithmetic on the tiny configs (L=16, 16-bit activations)."""
    r = find_ssm_layers(meta_model(family))[0]
    assert r.state_bytes == state
    assert r.buffer_bytes(16, act_bytes=2) == buffer


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
REWRITABLE = [f for f, d in TINY_FAMILIES.items() if KINDS[d.kind].mixin is not None]


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
