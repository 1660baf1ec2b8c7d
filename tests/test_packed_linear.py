"""Projections that share an input, their 16-bit weights packed into one buffer: one GEMM for them where
nothing else would differ, their own calls wherever anything does, and the same model after ``unpatch``."""

import copy

import pytest
import torch
import torch.nn.functional as F

import replayssm
from replayssm.patches import fused_linear, packed_linear
from replayssm.patches import delta as D
from replayssm.patches.packed_linear import pack_linears, packed_outputs, packed_weight, unpack_linears

from helpers import explain_decode_step, tiny

WIDTHS = (48, 24, 4, 4)  # Qwen3.5's in_proj_qkv, z, b, a in miniature


def _linears(dtype=torch.bfloat16, widths=WIDTHS, K=40, bias=False, seed=0):
    torch.manual_seed(seed)
    return [torch.nn.Linear(K, n, bias=bias).to(dtype) for n in widths]


def _allowed(forward):
    return False


def _separate(x, modules):
    return torch.cat([F.linear(x, m.weight) for m in modules], dim=-1)


def test_pack_keeps_values_and_parameters_and_makes_one_buffer():
    mods = _linears()
    params = [m.weight for m in mods]
    before = [p.detach().clone() for p in params]
    assert pack_linears(mods)
    assert [m.weight for m in mods] == params  # the same parameter objects
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert len({p.untyped_storage().data_ptr() for p in params}) == 1
    w = packed_weight(mods)
    assert w.shape == (sum(WIDTHS), 40) and torch.equal(w, torch.cat(before))
    assert not pack_linears(mods)  # already packed: nothing to do


def test_packed_outputs_are_the_separate_calls():
    mods = _linears()
    x = torch.randn(3, 5, 40).to(torch.bfloat16)
    want = _separate(x, mods)
    pack_linears(mods)
    with torch.no_grad():
        got = packed_outputs(x, mods, _allowed)
    assert got is not None and got.shape == (3, 5, sum(WIDTHS))
    ref = _separate(x.float(), [m.float() for m in copy.deepcopy(mods)])  # fp32 oracle
    scale = ref.abs().max().item()
    assert (got.float() - ref).abs().max().item() <= 2 ** -7 * scale  # one bf16 rounding of the output
    assert (got.float() - want.float()).abs().max().item() <= 2 ** -7 * scale


@pytest.mark.parametrize("case", ["fp32", "bias", "meta", "one", "shared"])
def test_what_is_never_packed(case):
    if case == "fp32":
        mods = _linears(torch.float32)
    elif case == "bias":
        mods = _linears(bias=True)
    elif case == "meta":
        with torch.device("meta"):
            mods = [torch.nn.Linear(40, n, bias=False, dtype=torch.bfloat16) for n in WIDTHS]
    elif case == "one":
        mods = _linears(widths=(8,))
    else:  # one parameter in two modules
        mods = _linears(widths=(8, 8))
        mods[1].weight = mods[0].weight
    ptrs = [m.weight.data_ptr() for m in mods]
    assert not pack_linears(mods)
    assert [m.weight.data_ptr() for m in mods] == ptrs
    assert case == "one" or packed_weight(mods) is None


@pytest.mark.parametrize("change", ["replaced", "cast", "hook", "grad", "instance_forward", "subclass_x"])
def test_anything_else_takes_the_separate_calls(change):
    mods = _linears()
    assert pack_linears(mods)
    x = torch.randn(2, 40).to(torch.bfloat16)
    if change == "replaced":
        mods[2].weight = torch.nn.Parameter(mods[2].weight.detach().clone())
    elif change == "cast":
        mods[1].half()
    elif change == "hook":
        mods[3].register_forward_hook(lambda *a: None)
    elif change == "instance_forward":
        mods[0].forward = lambda t: t
    elif change == "subclass_x":
        x = torch.nn.Parameter(x, requires_grad=False)
    if change == "grad":
        assert packed_outputs(x, mods, _allowed) is None  # autograd through views of one buffer: no
        with torch.no_grad():
            assert packed_outputs(x, mods, _allowed) is not None
    else:
        with torch.no_grad():
            assert packed_outputs(x, mods, _allowed) is None


def test_unpack_gives_each_weight_its_storage_back():
    model = torch.nn.ModuleList(_linears())
    before = [m.weight.detach().clone() for m in model]
    pack_linears(list(model))
    unpack_linears(model)
    assert len({m.weight.untyped_storage().data_ptr() for m in model}) == len(model)
    assert all(torch.equal(m.weight, b) and m.weight.untyped_storage().nbytes() == b.numel() * 2
               for m, b in zip(model, before))
    assert not any(packed_linear._PACKED in m.__dict__ for m in model)


#: per family: the projection groups of one delta-rule mixer
_GROUPS = {"qwen3_5": [D.QWEN3_5_PROJECTIONS], "qwen3_next": [D.QWEN3_NEXT_PROJECTIONS],
           "olmo_hybrid": [D.QKV_PROJECTIONS, D.OLMO_GATE_PROJECTIONS], "kimi_linear": [D.QKV_PROJECTIONS]}


def _gemm_calls(monkeypatch):
    calls = []
    linear = F.linear
    monkeypatch.setattr(packed_linear.torch.nn.functional, "linear",
                        lambda x, w, b=None: calls.append((tuple(w.shape), w.data_ptr())) or linear(x, w, b))
    return calls


@pytest.mark.parametrize("family", sorted(_GROUPS))
def test_patched_delta_layers_run_one_gemm_per_group(family, monkeypatch):
    """A bf16 patched model's delta-rule projections are packed, run one GEMM per group for a batch of rows
    (the logits within bf16 rounding of the separate calls'), ``unpatch`` leaves the weights' values and
    the state dict as they were, and a patched model cast after ``patch`` packs them again at its prefill."""
    model = copy.deepcopy(tiny(family)).to(torch.bfloat16)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(3, 500, (3, 6), generator=torch.Generator().manual_seed(0))
    replayssm.patch(model, buffer_len=4)
    groups = [[getattr(m, n) for n in names] for m in model.modules() if hasattr(m, "replay_options")
              and hasattr(m, _GROUPS[family][0][0]) for names in _GROUPS[family]]
    assert groups and all(packed_weight(g) is not None for g in groups)
    with torch.no_grad():
        cache = model(ids[:, :5], use_cache=True).past_key_values
        snapshot = copy.deepcopy(cache)
        calls = _gemm_calls(monkeypatch)
        got = model(ids[:, 5:], past_key_values=cache, use_cache=True).logits
        monkeypatch.undo()
        packed = [(tuple(packed_weight(g).shape), g[0].weight.data_ptr()) for g in groups]
        assert [c for c in calls if c in packed] == packed  # one GEMM per group, in layer order
        monkeypatch.setattr(fused_linear, "packed_outputs", lambda *a: None)  # the separate calls
        want = model(ids[:, 5:], past_key_values=snapshot, use_cache=True).logits
        monkeypatch.undo()
    torch.testing.assert_close(got.float(), want.float(), rtol=0.05, atol=0.05 * want.abs().max().item())
    replayssm.unpatch(model)
    assert all(len({m.weight.untyped_storage().data_ptr() for m in g}) == len(g) for g in groups)
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in state.items())
    replayssm.patch(model, buffer_len=4)
    model.half()  # each weight cast on its own: no longer packed, until the next prefill packs them again
    assert all(packed_weight(g) is None for g in groups)
    with torch.no_grad():
        model(ids[:, :5], use_cache=True)
    assert all(packed_weight(g) is not None and packed_weight(g).dtype == torch.float16 for g in groups)
    replayssm.unpatch(model)


def test_fp32_models_are_not_packed():
    model = tiny("qwen3_5")
    replayssm.patch(model, buffer_len=4)
    try:
        mixers = [m for m in model.modules() if hasattr(m, "replay_options") and hasattr(m, "in_proj_qkv")]
        assert mixers and all(packed_weight(m._projections(D.QWEN3_5_PROJECTIONS)) is None for m in mixers)
    finally:
        replayssm.unpatch(model)


def test_a_packed_model_saves_and_loads_its_weights(tmp_path):
    """``save_pretrained`` of a patched model with packed weights writes each weight as it is."""
    model = copy.deepcopy(tiny("qwen3_5")).to(torch.bfloat16)
    replayssm.patch(model, buffer_len=4)
    try:
        mixer = next(m for m in model.modules() if hasattr(m, "replay_options") and hasattr(m, "in_proj_qkv"))
        assert packed_weight(mixer._projections(D.QWEN3_5_PROJECTIONS)) is not None
        model.save_pretrained(tmp_path)
        loaded = type(model).from_pretrained(tmp_path, dtype=torch.bfloat16)
        want, got = model.state_dict(), loaded.state_dict()
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    finally:
        replayssm.unpatch(model)



def test_torch_compile_traces_a_packed_layer_without_breaks():
    """Under torch.compile a packed layer's projections are the separate calls, in one graph."""
    model = copy.deepcopy(tiny("qwen3_5")).to(torch.bfloat16)
    replayssm.patch(model, buffer_len=4)
    try:
        mixer, explained = explain_decode_step(model)
        assert packed_weight(mixer._projections(D.QWEN3_5_PROJECTIONS)) is not None
    finally:
        replayssm.unpatch(model)
    assert explained.graph_count == 1
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
