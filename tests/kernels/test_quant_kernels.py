"""Low-precision checkpoints in the Triton kernels under the interpreter (tiny fp32 shapes): the
shared quantize code bit for bit against ``replayssm.kernels.quant``, and each family's replay
step against the reference. GPU shapes: ``test_quant_kernels_gpu.py``."""

import pytest
import torch

from replayssm.kernels import quant as Q

from quant_helpers import compare

DEV = "cuda" if torch.cuda.is_available() else "cpu"
LOWP = [torch.int8, torch.float8_e4m3fn, torch.float16, torch.bfloat16]


def _codes(t):
    """Stored codes to compare bit for bit; e4m3's -0 as +0 (the GPU's fp32 -> e4m3 conversion writes
    +0 for a negative value that rounds to zero, the reference -0: the same value)."""
    if t.dtype == torch.float8_e4m3fn:
        b = t.view(torch.uint8)
        return torch.where(b == 0x80, torch.zeros_like(b), b)
    return t.view(torch.uint8) if t.element_size() == 1 else t


@pytest.mark.parametrize("dtype", LOWP)
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("sr", [False, True])
def test_triton_quantize_is_bit_exact(dtype, axis, sr):
    if dtype in (torch.float16, torch.bfloat16) and not sr:
        pytest.skip("nearest 16-bit stores are a plain cast")
    from replayssm.kernels.quant_triton import quant_probe

    g = torch.Generator().manual_seed(1)
    x = (torch.randn(12, 40, generator=g) * torch.logspace(-8, 2, 40)).to(DEV)
    x[3] = 0.0
    rng = torch.tensor([[12345, 77]], dtype=torch.int64, device=DEV) if sr else None
    q, d = quant_probe(x, dtype, axis, rng[0] if sr else None)
    u = Q._state_bits(rng, (12, 40))[0] if sr else None
    qr, dr = Q.quantize(x, dtype, axis, u)
    assert torch.equal(_codes(q), _codes(qr))
    assert (d is None and dr is None) or torch.equal(d, dr)


def check_vectors_at_the_edges(device):
    """Vectors holding NaN or inf keep a non-finite scale (every value they decode to is non-finite,
    never a silently finite state), in the kernels' rounding as in the reference; a vector below
    ``AMAX_FLOOR`` is stored as zero codes; finite vectors' codes and scales equal the reference's.
    fp16 / bf16 stochastic rounding keeps a NaN a NaN (the GPU's min / max would clamp it finite)."""
    from replayssm.kernels.quant_triton import quant_probe

    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 32, generator=g)
    x[1, 7] = float("nan")
    x[2, 3] = float("inf")
    x[3, 9] = float("-inf")
    x[4] *= 1e-33
    x[5] = 0.0
    for dtype in (torch.int8, torch.float8_e4m3fn):
        for sr in (False, True):
            rng = torch.tensor([[99, 5]], dtype=torch.int64, device=device) if sr else None
            q, d = quant_probe(x.to(device), dtype, 1, rng[0] if sr else None)
            qr, dr = Q.quantize(x, dtype, 1, Q._state_bits(rng.cpu(), (6, 32))[0] if sr else None)
            q, d = q.cpu(), d.cpu()
            for got, scale in ((q, d), (qr, dr)):
                assert not Q.dequantize(got[1:4], scale[1:4], 1).isfinite().any(), (dtype, sr)
                assert torch.equal(_codes(got[4:]), torch.zeros_like(_codes(got[4:]))), (dtype, sr)
            fin = [0, 4, 5]
            assert torch.equal(_codes(q[fin]), _codes(qr[fin])) and torch.equal(d[fin], dr[fin]), (dtype, sr)
            assert d[1].isnan() and dr[1].isnan() and d[2:4].isinf().all() and dr[2:4].isinf().all()
    for dtype in (torch.float16, torch.bfloat16):  # unscaled: NaN stays NaN through stochastic rounding
        rng = torch.tensor([[99, 5]], dtype=torch.int64, device=device)
        q, _ = quant_probe(x.to(device), dtype, 1, rng[0])
        qr, _ = Q.quantize(x, dtype, 1, Q._state_bits(rng.cpu(), (6, 32))[0])
        assert q.cpu()[1, 7].isnan() and qr[1, 7].isnan(), dtype
        fin = x.isfinite()
        assert torch.equal(q.cpu()[fin], qr[fin]), dtype


def test_vectors_at_the_edges():
    check_vectors_at_the_edges(DEV)


@pytest.mark.parametrize("axis", [0, 1])
def test_fp8_nearest_by_the_cast_is_bit_exact(axis):
    """Nearest e4m3 left to the store's cast (``CAST_E4M3``, what the Gated DeltaNet flush uses; on the
    GPU the hardware conversion, under the interpreter the integer rounding): the reference's codes,
    ties to even included (normal and subnormal ties, the top binade, zero)."""
    from replayssm.kernels.quant_triton import quant_probe

    ties = torch.tensor([448.0, 1.0625, 1.1875, -1.0625, 3 * 2.0 ** -10, 2.0 ** -10, 248.0, -248.0, 0.0, 2.0 ** -12])
    g = torch.Generator().manual_seed(2)
    x = torch.cat([ties, torch.randn(30, generator=g) * torch.logspace(-6, 2, 30)])[None, :].repeat(4, 1)
    x[1:] *= torch.logspace(-3, 1, 3)[:, None]  # rows whose scales are not 1
    x = x.to(DEV) if axis == 1 else x.t().contiguous().to(DEV)
    q, d = quant_probe(x, torch.float8_e4m3fn, axis, None, cast_e4m3=True)
    qr, dr = Q.quantize(x, torch.float8_e4m3fn, axis, None)
    assert torch.equal(_codes(q), _codes(qr)) and torch.equal(d, dr)


def test_int8_nearest_rounds_ties_to_even():
    """Nearest int8 codes: ties to even, like the float formats (and like torch.round), in the kernels
    and the reference; every integer in [-127, 127] and its neighbours stay exact."""
    from replayssm.kernels.quant_triton import quant_probe

    halves = torch.arange(-127, 127, dtype=torch.float32) + 0.5  # every tie in range
    ints = torch.arange(-127, 128, dtype=torch.float32)
    row = torch.cat([halves, ints, ints[:-1] + 0.25, ints[1:] - 0.25, torch.tensor([126.5, -126.75, 127.0])])
    x = row[None, :].to(DEV)  # amax 127 over the row: the encode factor is 1, values are their own codes
    q, _ = quant_probe(x, torch.int8, 1, None)
    qr, _ = Q.quantize(x, torch.int8, 1, None)
    want = torch.round(row.clamp(-127, 127)).to(torch.int8)
    assert torch.equal(qr.cpu()[0], want) and torch.equal(q.cpu()[0], want)
    assert want[:4].tolist() == [-126, -126, -124, -124]  # -126.5 -> -126, -125.5 -> -126, ...


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_triton_decodes_every_code_exactly(dtype):
    """The kernels' integer-and-fp32 decoding of 8-bit codes equals torch's conversion for every
    code (e4m3's subnormals included; its two NaN codes are never written)."""
    from replayssm.kernels.quant_triton import codes_probe

    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)
    if dtype == torch.float8_e4m3fn:
        codes = codes[~torch.isnan(codes.float())]
    got = codes_probe(codes.to(DEV)).cpu()
    assert torch.equal(got.view(torch.int32), codes.float().view(torch.int32))


def check_planes_dot(device):
    """``planes_dot`` (int8 codes against a vector in byte planes, integer dot products) against a
    float64 oracle: within 2^-21 of sum |code| * max |c| plus |exact| (its one rounding of c, a few
    fp32 ulps of the largest element); every code from -128 to 127, elements spanning 40 binades,
    elements near the top of fp32's range, zero vectors, and NaN from any element that is not finite."""
    from replayssm.kernels.int8_dot import planes_probe

    g = torch.Generator().manual_seed(7)
    codes = torch.randint(-128, 128, (32, 128), generator=g, dtype=torch.int32).to(torch.int8)
    codes[0] = torch.arange(-128, 128, 2).to(torch.int8)
    codes[1] = 127
    for scale in (1e-30, 3e-3, 1.0, 7e4):
        c = torch.randn(128, generator=g) * scale * torch.exp2(torch.randint(-20, 20, (128,), generator=g).float())
        c[5] = 0.0
        got = planes_probe(codes.to(device), c.to(device)).cpu().double()
        exact = codes.double() @ c.double()
        bound = (codes.double().abs().sum(1) * c.abs().max().double() + exact.abs()) * 2.0 ** -21
        assert ((got - exact).abs() <= bound).all(), float(((got - exact).abs() / bound).max())
    assert torch.equal(planes_probe(codes.to(device), torch.zeros(128, device=device)).cpu(), torch.zeros(32))
    pick = torch.zeros(32, 128, dtype=torch.int8)
    pick[torch.arange(32), torch.arange(32) * 4 + 1] = torch.tensor([1, -1] * 16, dtype=torch.int8)
    big = torch.randn(128, generator=g) * 1e37  # products that fit fp32 only one code at a time
    want = pick.double() @ big.double()
    got = planes_probe(pick.to(device), big.to(device)).cpu().double()
    assert ((got - want).abs() <= big.abs().max().double() * 2.0 ** -21).all()
    for bad in (float("inf"), float("-inf"), float("nan")):
        c = torch.randn(128, generator=g)
        c[17] = bad
        assert torch.isnan(planes_probe(codes.to(device), c.to(device))).all()


def test_planes_dot_matches_float64():
    check_planes_dot(DEV)


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
@pytest.mark.parametrize("dtype,sr", [(torch.int8, False), (torch.int8, True), (torch.float8_e4m3fn, False),
                                      (torch.float8_e4m3fn, True), (torch.bfloat16, True)])
@pytest.mark.parametrize("batch", [3, 6])  # one-launch / fma flush, and the multi-launch / dot flush
def test_replay_kernel_matches_reference(family, dtype, sr, batch):
    y_err, off, same_rng = compare(family, dtype, sr, batch, steps=5, device=DEV)
    assert y_err < 1e-4
    assert off == 0.0, "a stored value is more than one quantum from the reference's"
    assert same_rng


@pytest.mark.parametrize("N,words,dots", [(32, True, False), (32, True, True), (10, False, True)],
                         ids=["int32-words", "int32-words-dp4a", "bytes"])
@pytest.mark.parametrize("sr", [False, True])
def test_mamba2_split_routes_int8_words(N, words, dots, sr, monkeypatch):
    """Mamba-2's split routes on an int8 checkpoint (the default from batch 128): the output-only
    launch reads the codes as int32 words where N is a multiple of 4 (decoded, or as ``dp4a``
    products with ``word_dots``) and bytes otherwise; each follows the reference (outputs, stored
    codes, counters) with rows at staggered cursors."""
    import dataclasses

    from replayssm.kernels.mamba2 import launch

    default, state_words, views = launch.default_config, launch.state_words, []
    monkeypatch.setattr(launch, "default_config", lambda *a: dataclasses.replace(
        default(*a), split_routes=True, flush_warps=2, word_dots=dots))
    monkeypatch.setattr(launch, "state_words", lambda *a: views.append(state_words(*a)) or views[-1])
    y_err, off, same_rng = compare("mamba2", torch.int8, sr, 6, steps=7, device=DEV, shape=(2, 16, N, 1))
    assert views and all((v is not None) is words for v in views)
    assert y_err < 1e-4
    assert off == 0.0, "a stored value is more than one quantum from the reference's"
    assert same_rng


@pytest.mark.parametrize("family,dtype", [("gdn", torch.float8_e4m3fn), ("kda", torch.int8)])
def test_delta_output_launch_over_key_tiles(family, dtype, monkeypatch):
    """The output launch walking the key dim in tiles (``block_k`` < K: e4m3's rule from batch 256)
    on an 8-bit checkpoint: codes read tile by tile times the column scales; outputs, stored codes
    and counters follow the reference."""
    import dataclasses

    from replayssm.kernels.delta import launch

    default = launch.default_config
    monkeypatch.setattr(launch, "default_config",
                        lambda *a: dataclasses.replace(default(*a), block_v=16, block_k=16))
    y_err, off, same_rng = compare(family, dtype, True, 6, steps=5, device=DEV, shape=(2, 1, 32, 16))
    assert y_err < 1e-4
    assert off == 0.0, "a stored value is more than one quantum from the reference's"
    assert same_rng


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("V,words", [(16, True), (10, False)], ids=["int32-words", "bytes"])
def test_delta_output_launch_int8_words(family, V, words, monkeypatch):
    """The delta rule's output launch reads an int8 checkpoint as int32 words of four value columns
    where V and the strides allow it, else as bytes; both follow the reference (outputs, stored
    codes, counters)."""
    from replayssm.kernels.delta import launch

    seen, kernel = [], launch.output_kernel

    class Spy:
        def __getitem__(self, grid):
            return lambda *a, **kw: seen.append(kw["WORDS"]) or kernel[grid](*a, **kw)

    monkeypatch.setattr(launch, "output_kernel", Spy())
    y_err, off, same_rng = compare(family, torch.int8, True, 6, steps=7, device=DEV, shape=(4, 2, 16, V))
    assert seen and all(w is words for w in seen), seen
    assert y_err < 1e-4
    assert off == 0.0, "a stored value is more than one quantum from the reference's"
    assert same_rng
