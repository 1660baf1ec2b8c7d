"""The decode step's linear layers on the small-batch GEMV: per-instance, reversible, and the module's
own path wherever the kernel does not apply."""

import copy
import os

import pytest
import torch

import replayssm
from replayssm.patches import delta as D
from replayssm.patches import fused_linear
from replayssm.patches.fused_linear import fuse_decode_linears, unfuse_decode_linears

from helpers import tiny

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="runs the kernel on CPU tensors through Triton's interpreter")


def _linears(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def _ids(batch=2, length=3, seed=0):
    return torch.randint(3, 500, (batch, length), generator=torch.Generator().manual_seed(seed))


def _count_kernel_calls(monkeypatch):
    """(x's shape, weight) of every weight a kernel launch reads: one, grouped, or gated."""
    calls = []
    single, group, gated = (fused_linear.linear_small_batch_triton, fused_linear.linear_small_batch_group_triton,
                            fused_linear.linear_small_batch_gated_triton)

    def counted(x, weight, bias=None):
        calls.append((tuple(x.shape), weight))
        return single(x, weight, bias)

    def counted_group(x, weights, biases=None):
        calls.extend((tuple(x.shape), w) for w in weights)
        return group(x, weights, biases)

    def counted_gated(x, gate_weight, up_weight, activation):
        calls.extend((tuple(x.shape), w) for w in (gate_weight, up_weight))
        return gated(x, gate_weight, up_weight, activation=activation)

    monkeypatch.setattr(fused_linear, "linear_small_batch_triton", counted)
    monkeypatch.setattr(fused_linear, "linear_small_batch_group_triton", counted_group)
    monkeypatch.setattr(fused_linear, "linear_small_batch_gated_triton", counted_gated)
    return calls


def _force_kernel_on_cpu_fp32(monkeypatch):
    """The kernel path for CPU tensors and fp32 weights (Triton's interpreter runs it), for as many rows as
    the kernel takes, launched as for a device of 4 multiprocessors (larger tiles: fewer programs to
    interpret)."""
    from replayssm.kernels import linear

    monkeypatch.setattr(linear, "num_sms", lambda *device: 4)
    monkeypatch.setattr(fused_linear, "KERNEL_DEVICES", ("cpu",))
    monkeypatch.setattr(fused_linear, "KERNEL_WEIGHT_DTYPES", (torch.float32,))
    monkeypatch.setattr(fused_linear, "DECODE_ROWS", linear.M_MAX)
    monkeypatch.setattr(fused_linear, "_capturing", lambda: True)
    monkeypatch.setenv("REPLAYSSM_BACKEND", "triton")  # Triton on CPU tensors: the interpreter


def test_fuse_and_unfuse_restore_exactly():
    model = tiny("qwen3_5")
    before = {name: dict(m.__dict__) for name, m in model.named_modules()}
    linears = _linears(model)
    assert len(linears) > 20 and fuse_decode_linears(model) == len(linears)
    assert fuse_decode_linears(model) == len(linears)  # again: nothing wrapped twice
    for m in linears:
        forward = m.__dict__["forward"]
        assert forward.func is fused_linear._small_batch_forward and forward.args == (m,)
    assert "forward" not in model.get_input_embeddings().__dict__
    assert type(model.lm_head) is torch.nn.Linear and "forward" in model.lm_head.__dict__
    unfuse_decode_linears(model)
    after = {name: dict(m.__dict__) for name, m in model.named_modules()}
    assert after.keys() == before.keys()
    for name, attrs in before.items():
        assert after[name].keys() == attrs.keys(), name
        assert all(after[name][k] is v for k, v in attrs.items()), name


def test_other_forwards_are_left_alone():
    """A Linear whose forward is already an instance attribute (another wrapper), or a subclass with its
    own forward, is not rewritten, and unfusing keeps the other wrapper."""

    class Scaled(torch.nn.Linear):
        def forward(self, input):
            return 2 * super().forward(input)

    wrapped, sub, plain = torch.nn.Linear(4, 3), Scaled(4, 3), torch.nn.Linear(4, 3)
    other = wrapped.forward = lambda x: x
    model = torch.nn.ModuleList([wrapped, sub, plain])
    assert fuse_decode_linears(model) == 1 and "forward" in plain.__dict__ and "forward" not in sub.__dict__
    unfuse_decode_linears(model)
    assert wrapped.__dict__["forward"] is other and "forward" not in plain.__dict__


@torch.no_grad()
def test_cpu_tensors_take_the_module_path(monkeypatch):
    model = tiny("qwen3_5")
    want = model(_ids()).logits
    calls = _count_kernel_calls(monkeypatch)
    replayssm.patch(model, buffer_len=4)
    try:
        assert all(fused_linear._is_ours(m.__dict__.get("forward")) for m in _linears(model))
        assert torch.equal(model(_ids()).logits, want) and calls == []
    finally:
        replayssm.unpatch(model)
    assert not any("forward" in m.__dict__ for m in _linears(model))


@needs_interpreter
def test_forced_kernel_path_matches_the_module(monkeypatch):
    """Every linear of a forward of 1 x 2 tokens (the kernel's M_MAX rows) runs the kernel (interpreter, fp32):
    logits within fp32 rounding of the unpatched model's; above the rows it takes, with autograd, with
    REPLAYSSM_BACKEND=torch and for other dtypes the module runs."""
    model = tiny("qwen3_5")
    ids = _ids(batch=1, length=2)
    with torch.no_grad():
        want = model(ids).logits
    fuse_decode_linears(model)
    try:
        with torch.no_grad():  # the prefill before a capture: the MLPs' first call checks their form
            assert torch.equal(model(ids).logits, want)
        calls = _count_kernel_calls(monkeypatch)
        _force_kernel_on_cpu_fp32(monkeypatch)
        with torch.no_grad():
            got = model(ids).logits
        assert {id(w) for _, w in calls} == {id(m.weight) for m in _linears(model)}
        assert len(calls) == len(_linears(model))  # each weight read once
        assert all(shape[:-1] == (1, 2) for shape, _ in calls)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
        calls.clear()
        with torch.no_grad():  # 3 rows: more than the rows the kernel takes
            model(_ids(batch=1, length=3))
        loss = model(ids).logits.square().mean()  # autograd: the module's forward, gradients flow
        loss.backward()
        assert calls == [] and model.lm_head.weight.grad is not None
        model.zero_grad(set_to_none=True)
        monkeypatch.setenv("REPLAYSSM_BACKEND", "torch")  # the override is honoured
        with torch.no_grad():
            assert torch.equal(model(ids).logits, want) and calls == []
        monkeypatch.setenv("REPLAYSSM_BACKEND", "triton")
        monkeypatch.setattr(fused_linear, "KERNEL_WEIGHT_DTYPES", (torch.bfloat16, torch.float16))
        with torch.no_grad():
            assert torch.equal(model(ids).logits, want) and calls == []  # fp32 weights: the module's path
    finally:
        unfuse_decode_linears(model)


def test_tensor_subclass_weights_take_the_module_path(monkeypatch):
    """A weight that is a tensor subclass (e.g. a quantized weight reporting a 16-bit dtype) is not read
    as plain memory: the module's forward runs."""

    class Wrapped(torch.Tensor):
        pass

    lin = torch.nn.Linear(8, 4)
    plain_weight = lin.weight
    lin.weight = torch.nn.Parameter(lin.weight.detach().as_subclass(Wrapped))
    fuse_decode_linears(lin)
    calls = _count_kernel_calls(monkeypatch)
    _force_kernel_on_cpu_fp32(monkeypatch)
    x = torch.randn(2, 8)
    with torch.no_grad():
        assert torch.equal(lin(x).as_subclass(torch.Tensor), torch.nn.functional.linear(x, plain_weight, lin.bias))
    assert calls == [] and type(lin.weight) is Wrapped


def test_deep_copy_of_a_patched_model_owns_its_forwards():
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    fuse_decode_linears(model)
    twin = copy.deepcopy(model)
    for mine, theirs in zip(_linears(model), _linears(twin)):
        assert theirs.__dict__["forward"].args[0] is theirs and mine.__dict__["forward"].args[0] is mine
    with torch.no_grad():
        twin[0].weight.zero_()
        twin[0].bias.zero_()
    x = torch.randn(3, 8)
    assert torch.equal(twin[0](x), torch.zeros(3, 4)) and not torch.equal(model[0](x), torch.zeros(3, 4))


def test_module_path_overhead_is_small():
    """The wrapper's decision costs a few µs a call (the bound is loose for shared CI machines; the
    figure on an idle core is printed)."""
    import time

    lin = torch.nn.Linear(64, 64)
    x = torch.randn(1, 64)

    def per_call():
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(2000):
                lin(x)
            best = min(best, (time.perf_counter() - start) / 2000)
        return best

    with torch.no_grad():
        plain = per_call()
        fuse_decode_linears(lin)
        try:
            wrapped = per_call()
        finally:
            unfuse_decode_linears(lin)
    print(f"module path: {plain * 1e6:.2f} µs plain, {wrapped * 1e6:.2f} µs through the wrapper")
    assert wrapped - plain < 20e-6


def test_torch_compile_traces_through_the_wrapper():
    """Under torch.compile the wrapper takes the module's path, in one graph (no break)."""
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    x = torch.randn(2, 16)
    want = model(x)
    fuse_decode_linears(model)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.no_grad():
        got = torch.compile(model, backend=backend, fullgraph=True)(x)
    assert torch.equal(got, want) and len(graphs) == 1
    torch._dynamo.reset()


@needs_interpreter
def test_outside_a_capture_and_above_one_row_the_module_runs(monkeypatch):
    """The kernel runs only for one-row calls inside a CUDA-graph capture (eager launches cost more host
    time than cuBLAS's; more rows were slower than cuBLAS); everything else is the module's forward."""
    lin = torch.nn.Linear(24, 20)
    fuse_decode_linears(lin)
    calls = _count_kernel_calls(monkeypatch)
    _force_kernel_on_cpu_fp32(monkeypatch)
    monkeypatch.setattr(fused_linear, "DECODE_ROWS", 1)
    x1, x2 = torch.randn(1, 24), torch.randn(2, 24)
    with torch.no_grad():
        monkeypatch.setattr(fused_linear, "_capturing", lambda: False)
        lin(x1)
        assert calls == []
        monkeypatch.setattr(fused_linear, "_capturing", lambda: True)
        lin(x2)
        assert calls == []
        torch.testing.assert_close(lin(x1), torch.nn.functional.linear(x1, lin.weight, lin.bias))
        assert len(calls) == 1


class _SwappedMLP(torch.nn.Module):
    """gate/up/down/act_fn like a gated MLP, computing something else: never fused."""

    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj = torch.nn.Linear(16, 24, bias=False), torch.nn.Linear(16, 24, bias=False)
        self.down_proj, self.act_fn = torch.nn.Linear(24, 16, bias=False), torch.nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.up_proj(x)) * self.gate_proj(x))


@needs_interpreter
def test_gated_mlp_runs_one_launch_only_where_its_form_checks(monkeypatch):
    """A gated MLP's gate and up projections are one gated launch inside a capture once its first call
    (outside a capture) found ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``; a module of the same
    parts computing something else keeps its forward; unfusing removes both attributes."""
    model = tiny("qwen3_5")
    mlp = next(m for m in model.modules() if type(m).__name__.endswith("MLP"))
    swapped = _SwappedMLP()
    x = torch.randn(1, 1, mlp.gate_proj.in_features)
    xs = torch.randn(1, 1, 16)
    with torch.no_grad():
        want, want_swapped = mlp(x), swapped(xs)
        fuse_decode_linears(mlp)
        fuse_decode_linears(swapped)
        assert mlp(x).equal(want) and swapped(xs).equal(want_swapped)  # first calls: the checks
    assert mlp.__dict__[fused_linear._MLP_ATTR] == "silu" and swapped.__dict__[fused_linear._MLP_ATTR] is False
    calls = _count_kernel_calls(monkeypatch)
    _force_kernel_on_cpu_fp32(monkeypatch)
    launches = []
    gated = fused_linear.linear_small_batch_gated_triton
    monkeypatch.setattr(fused_linear, "linear_small_batch_gated_triton",
                        lambda *a, **k: launches.append(a[1:3]) or gated(*a, **k))
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
        torch.testing.assert_close(swapped(xs), want_swapped, rtol=1e-5, atol=1e-6)
    assert launches == [(mlp.gate_proj.weight, mlp.up_proj.weight)]
    assert sorted(id(w) for _, w in calls) == sorted(id(m.weight) for m in _linears(mlp) + _linears(swapped))
    unfuse_decode_linears(mlp)
    unfuse_decode_linears(swapped)
    assert not any(k in m.__dict__ for m in (mlp, swapped) for k in ("forward", fused_linear._MLP_ATTR))


#: per family: the projection groups of one delta-rule mixer
_GROUPS = {"qwen3_5": [D.QWEN3_5_PROJECTIONS], "qwen3_next": [D.QWEN3_NEXT_PROJECTIONS],
           "olmo_hybrid": [D.QKV_PROJECTIONS, D.OLMO_GATE_PROJECTIONS], "kimi_linear": [D.QKV_PROJECTIONS]}


@needs_interpreter
@pytest.mark.parametrize("family", sorted(_GROUPS))
def test_delta_projections_are_grouped_launches(family, monkeypatch):
    """The delta-rule mixers' projections that share their input are one launch per group in a forced
    one-row decode step, with the step's logits within fp32 rounding of the module path's."""
    model = tiny(family)
    ids = _ids(batch=1, length=5)
    replayssm.patch(model, buffer_len=4)
    try:
        with torch.no_grad():
            out = model(ids[:, :4], use_cache=True)
            cache = out.past_key_values
            snapshot = copy.deepcopy(cache)
            want = model(ids[:, 4:], past_key_values=cache, use_cache=True).logits
        groups = []
        group = fused_linear.linear_small_batch_group_triton
        monkeypatch.setattr(fused_linear, "linear_small_batch_group_triton",
                            lambda x, weights, biases=None: groups.append(weights) or group(x, weights, biases))
        _force_kernel_on_cpu_fp32(monkeypatch)
        monkeypatch.setattr(fused_linear, "DECODE_ROWS", 1)
        with torch.no_grad():
            got = model(ids[:, 4:], past_key_values=snapshot, use_cache=True).logits
        mixers = [m for m in model.modules() if hasattr(m, "replay_options") and hasattr(m, _GROUPS[family][0][0])]
        assert mixers and [tuple(map(id, g)) for g in groups] == [
            tuple(id(getattr(m, n).weight) for n in names) for m in mixers for names in _GROUPS[family]]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    finally:
        replayssm.unpatch(model)
