"""Check a converted checkpoint: the stock model and the ReplaySSM model must agree.

``validate_checkpoint(path)`` loads the checkpoint once with stock transformers (which
ignores the ``replayssm`` block: this also proves other runtimes load it as the original
model), decodes a fixed random prompt greedily, then applies the recorded block with
``replayssm.patch`` and decodes again with the reference tokens forced (teacher forcing),
so the logits of every step can be compared even after a near tie. The decode is long
enough to cross at least one checkpoint flush.

Logits tolerance (max |difference| of the raw logits, relative to the largest reference
logit ``scale``): fp32 1e-4 x max(1, scale); fp16 5e-2 x scale; bf16 0.15 x scale — the
looser of the model dtype's and the checkpoint-state dtype's (``state_dtype``). In 16-bit
the stock path itself rounds differently from the ReplaySSM path (which keeps fp32 states),
so the logits bound is loose there and the greedy tokens carry the check: they must agree
at every step, except at a near tie — where the reference's top-2 margin is within twice
the logits difference measured at that step, so rounding may pick either token.

fp32 oracle (16-bit models only, when a check against the stock model fails): the stock
model in the same 16-bit dtype is not always the more accurate of the two (a stock path
that rounds its recurrent state to 16 bits every step, e.g. through other kernels, can be
the noisier one). The model is then unpatched, upcast to fp32 and decoded once more with
the same tokens forced; the check passes if the ReplaySSM logits are no further from the
fp32 ones than the stock 16-bit logits are (x1.25, plus the fp32 tolerance), and ReplaySSM's
greedy tokens disagree with the fp32 model's (outside near ties) no more often than the
stock model's do.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .config import (CONFIG_KEY, StateDtype, block_layer_names, config_dtype_name, parse_device,
                     parse_model_dtype,
                     stack_relative_name)
from .errors import CheckpointError, ConfigError
from .formatting import count as _count
from .progress import NULL_PROGRESS, Progress

RELATIVE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-2, torch.bfloat16: 1.5e-1}
#: fidelity bounds of an 8-bit or stochastically rounded checkpoint (teacher-forced, against the stock
#: model's logits): its rounding legitimately moves every logit a little, so token equality is the wrong
#: test; a wrong scale or a misread checkpoint moves them by whole standard deviations. Mean |diff| in units
#: of the reference logits' std: 0.1 (the tiny test models measure 0.01-0.06 with fp8 at L=4); greedy-token
#: agreement: 0.8 (random test models have many near ties among their top tokens)
FIDELITY_MEAN_STD = 0.1
FIDELITY_ARGMAX = 0.8


@dataclass(frozen=True)
class Check:
    """One validation check: what was checked, whether it held, the measured values."""

    name: str
    ok: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ValidationResult:
    passed: bool
    device: str
    dtype: str
    batch: int
    prompt_len: int
    new_tokens: int
    buffer_len: int
    flushes: int
    max_abs_diff: float | None = None
    tolerance: float | None = None
    logit_scale: float | None = None
    tokens_compared: int = 0
    tokens_equal: int = 0
    near_ties: int = 0
    oracle: str | None = None  # "fp32" when the 16-bit comparison was settled against an fp32 decode
    oracle_stock_diff: float | None = None  # max |stock 16-bit logits - fp32 logits|
    oracle_patched_diff: float | None = None  # max |ReplaySSM 16-bit logits - fp32 logits|
    rewritten: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    elapsed_s: float = 0.0

    def add(self, name: str, ok: bool, detail: str) -> bool:
        self.checks.append(Check(name, ok, detail))
        return ok

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (an infinite or NaN measurement becomes None)."""
        d = asdict(self)
        d["checks"] = [c.to_dict() for c in self.checks]
        for key in ("max_abs_diff", "tolerance", "logit_scale", "oracle_stock_diff", "oracle_patched_diff"):
            if isinstance(d[key], float) and not math.isfinite(d[key]):
                d[key] = None
        return d


def dtype_name(dtype: torch.dtype) -> str:
    for name in StateDtype:
        if name.torch_dtype == dtype:
            return name.value
    return str(dtype).replace("torch.", "")


def tolerance(dtype: torch.dtype, scale: float) -> float:
    """Allowed max |logit difference| for logits of magnitude up to ``scale``."""
    rel = RELATIVE_TOLERANCE.get(dtype, 5e-2)
    return rel * max(1.0, scale) if dtype == torch.float32 else rel * max(scale, 1e-3)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """"auto" -> cuda when available, else cpu; check that the device exists."""
    name = parse_device(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {device!r} asked for, but CUDA is not available (torch {torch.__version__})",
                hint="pass --device cpu, or --no-validate to skip the check",
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
    elif dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ConfigError(f"device {device!r} asked for, but MPS is not available", hint="pass --device cpu")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device, config: dict[str, Any] | None = None) -> torch.dtype:
    """"auto" -> the checkpoint's dtype on GPUs, fp32 on CPU (CPU half-precision is slow); else any
    spelling ``parse_model_dtype`` accepts."""
    name = parse_model_dtype(dtype)
    if name == "auto":
        if device.type == "cpu":
            return torch.float32
        name = config_dtype_name(config or {}) or StateDtype.BF16.value
    return StateDtype(name).torch_dtype


class _ForceTokens:
    """A logits processor that makes generate emit given tokens (teacher forcing)."""

    def __init__(self, tokens: torch.Tensor, prompt_len: int):
        self.tokens = tokens
        self.prompt_len = prompt_len

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.prompt_len
        forced = self.tokens[:, step].to(scores.device)
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, forced[:, None], 0.0)
        return out


def _generate(model, input_ids, new_tokens: int, pad_id: int, force: torch.Tensor | None = None):
    from transformers import GenerationConfig, LogitsProcessorList

    gen = GenerationConfig(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=1,
        output_logits=True, return_dict_in_generate=True, use_cache=True, pad_token_id=pad_id,
    )
    processors = LogitsProcessorList([_ForceTokens(force, input_ids.shape[1])] if force is not None else [])
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), generation_config=gen,
                             logits_processor=processors)
    logits = torch.stack(list(out.logits), dim=1).float()  # (B, N, V)
    tokens = out.sequences[:, input_ids.shape[1]:]
    return tokens, logits


def _token_disagreements(ref_logits: torch.Tensor, logits: torch.Tensor, tol: float):
    """(bad, margin, near_tie), each (B, N): greedy tokens that differ from the reference's
    outside a near tie (reference top-2 margin within twice the step's logits difference,
    capped at ``tol``)."""
    top2 = ref_logits.topk(2, dim=-1).values if ref_logits.shape[-1] > 1 else ref_logits.repeat(1, 1, 2)
    margin = top2[..., 0] - top2[..., 1]
    step_diff = (logits - ref_logits).abs().amax(-1)
    step_diff = torch.where(torch.isnan(step_diff), torch.full_like(step_diff, float("inf")), step_diff)
    near_tie = margin <= 2 * torch.minimum(step_diff, torch.full_like(step_diff, tol))
    bad = (ref_logits.argmax(-1) != logits.argmax(-1)) & ~near_tie
    return bad, margin, near_tie


def _settle_against_fp32(result, model, input_ids, new_tokens, pad_id, ref_tokens, ref_logits, pat_logits, diff, tol,
                         scale, flush_text) -> None:
    """The fp32 oracle of the module docstring: adds the "logits" and "tokens" checks."""
    from .api import unpatch

    unpatch(model)
    model.to(torch.float32)
    _, f32_logits = _generate(model, input_ids, new_tokens, pad_id, force=ref_tokens)
    stock_err = float((ref_logits - f32_logits).abs().max())
    pat_err = float((pat_logits - f32_logits).abs().max())
    result.oracle, result.oracle_stock_diff, result.oracle_patched_diff = "fp32", stock_err, pat_err
    ok = pat_err <= 1.25 * stock_err + tolerance(torch.float32, scale)
    steps = ref_logits.shape[1]
    result.add("logits", ok,
               f"logits over {result.batch}x{steps} steps ({flush_text}): {diff:.2e} from the stock {result.dtype} "
               f"model (tol {tol:.1e}); against the fp32 model ReplaySSM is {pat_err:.2e} off, the stock "
               f"{result.dtype} model {stock_err:.2e}" + ("" if ok else " (ReplaySSM is the further)"))
    n_pat = int(_token_disagreements(f32_logits, pat_logits, tol)[0].sum())
    n_stock = int(_token_disagreements(f32_logits, ref_logits, tol)[0].sum())
    result.add("tokens", n_pat <= n_stock,
               f"greedy tokens: {result.tokens_equal}/{result.tokens_compared} equal to the stock model's; against "
               f"the fp32 model (outside near ties) ReplaySSM differs at {n_pat}, the stock model at {n_stock}")


def _rounds_checkpoint(rs_config) -> bool:
    """Whether the checkpoint is 8-bit or stochastically rounded (validated by fidelity, not tokens)."""
    return rs_config.state_dtype in ("fp8", "int8") or rs_config.state_rounding == "stochastic"


def _fidelity_checks(result, ref_logits, pat_logits, flush_text: str, block) -> None:
    """The teacher-forced fidelity criterion of an 8-bit or stochastic checkpoint: mean |diff| in
    units of the reference logits' std, and greedy-token agreement (bounds: ``FIDELITY_*``)."""
    std = float(ref_logits.std()) or 1.0
    mean = float((pat_logits - ref_logits).abs().mean()) / std
    agree = float((pat_logits.argmax(-1) == ref_logits.argmax(-1)).float().mean())
    what = f"{block.get('state_dtype', 'fp32')} checkpoint, {block.get('state_rounding', 'nearest')} rounding"
    result.add("fidelity", mean <= FIDELITY_MEAN_STD and agree >= FIDELITY_ARGMAX,
               f"teacher-forced over {result.batch}x{ref_logits.shape[1]} steps ({flush_text}, {what}): mean "
               f"|logit diff| {mean:.3f} std (bound {FIDELITY_MEAN_STD}), greedy tokens agree {agree:.3f} "
               f"(bound {FIDELITY_ARGMAX}) with the stock {result.dtype} model")


def _nonfinite_stock_error(model, dtype: str) -> CheckpointError:
    """The error for a stock model whose own logits are NaN/inf: name the non-finite weights, if any."""
    bad = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.is_floating_point() and not bool(torch.isfinite(param).all()):
                bad.append(name)
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        return CheckpointError(
            f"the input checkpoint's weights are not finite: {_count(len(bad), 'tensor')} hold NaN or inf "
            f"({shown}), and the stock model's logits are NaN/inf, so there is nothing to validate against",
            hint="check the source checkpoint (a failed training step or a damaged save?); --no-validate skips "
                 "the comparison",
        )
    return CheckpointError(
        f"the stock model's own logits are NaN/inf when run in {dtype} (its weights are finite), so there is "
        "nothing to validate against",
        hint="the model may overflow in this dtype: try --dtype fp32 (or bf16), or --no-validate",
    )


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def validate_checkpoint(
    path: str | Path,
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    seed: int = 0,
    batch: int = 2,
    prompt_len: int = 8,
    new_tokens: int | None = None,
    trust_remote_code: bool = False,
    progress: Progress | None = None,
) -> ValidationResult:
    """Load a converted checkpoint and compare the stock model with the ReplaySSM one.

    Returns the result (``passed`` False when a comparison fails); raises CheckpointError
    when stock transformers cannot load the checkpoint, ConfigError for a bad device/dtype.
    """
    from transformers import AutoConfig

    from .api import patch, replayssm_report
    from .checkpoint_dir import read_config_json
    from .config import ReplaySSMConfig
    from .resolve import causal_lm_class

    progress = progress or NULL_PROGRESS
    start = time.perf_counter()
    path = Path(path)
    config_dict = read_config_json(path)
    block = config_dict.get(CONFIG_KEY)
    rs_config = ReplaySSMConfig.from_block(block) if block is not None else None
    if rs_config is None:
        raise ConfigError(f"{path}/config.json has no {CONFIG_KEY} block", hint="convert it with `replayssm convert`")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev, config_dict)
    if new_tokens is None:
        new_tokens = max(24, rs_config.buffer_len + 8)
    result = ValidationResult(
        passed=False, device=str(dev), dtype=dtype_name(dt), batch=batch, prompt_len=prompt_len,
        new_tokens=new_tokens, buffer_len=rs_config.buffer_len, flushes=max(0, new_tokens - 1) // rs_config.buffer_len,
    )
    key = "validate"
    progress.start(key, f"Validating on {dev}", total=4)
    try:
        # 1. stock load
        try:
            hf_config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
            cls = causal_lm_class(hf_config, trust_remote_code=trust_remote_code)
            extra = {"trust_remote_code": True} if trust_remote_code else {}
            model, info = cls.from_pretrained(
                str(path), config=hf_config, dtype=dt, device_map=str(dev), output_loading_info=True, **extra,
            )
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            raise CheckpointError(
                f"stock transformers cannot load the converted checkpoint: {_short(exc)}",
                hint="the input checkpoint may not match its config.json; try loading it with transformers",
            ) from None
        model.eval()
        missing = list(info.get("missing_keys") or [])
        mismatched = list(info.get("mismatched_keys") or [])
        loaded_ok = not missing and not mismatched
        detail = f"{type(model).__name__}, {result.dtype} on {dev}"
        if missing:
            detail += f"; missing weights: {', '.join(map(str, missing[:3]))}{' ...' if len(missing) > 3 else ''}"
        if mismatched:
            detail += f"; shape mismatches: {', '.join(str(m[0] if isinstance(m, tuple) else m) for m in mismatched[:3])}"
        if not result.add("load", loaded_ok, f"stock transformers loads the checkpoint ({detail})"):
            return result
        progress.advance(key)

        # 2. reference decode
        emb = model.get_input_embeddings()
        vocab = int(getattr(emb, "num_embeddings", 0) or model.config.get_text_config().vocab_size)
        text_cfg = model.config.get_text_config()
        vocab = min(vocab, int(getattr(text_cfg, "vocab_size", vocab) or vocab))
        gen = torch.Generator().manual_seed(seed)
        low = 3 if vocab > 8 else 0
        input_ids = torch.randint(low, vocab, (batch, prompt_len), generator=gen).to(dev)
        pad_id = getattr(text_cfg, "pad_token_id", None)
        if not isinstance(pad_id, int):
            eos = getattr(text_cfg, "eos_token_id", None)
            pad_id = eos if isinstance(eos, int) else (eos[0] if isinstance(eos, list) and eos else 0)
        ref_tokens, ref_logits = _generate(model, input_ids, new_tokens, pad_id)
        if not bool(torch.isfinite(ref_logits).all()):
            raise _nonfinite_stock_error(model, result.dtype)
        progress.advance(key)

        # 3. apply the recorded block, decode with the reference tokens forced
        patch(model)
        rewritten = [r.name for r in replayssm_report(model).get("rewritten", [])]
        result.rewritten = rewritten
        recorded = block_layer_names(block)
        same = sorted(stack_relative_name(n) for n in rewritten) == sorted(recorded)
        if not result.add("patch", same,
                          f"replayssm block applied: {_count(len(rewritten), 'layer')} rewritten, buffer_len "
                          f"{rs_config.buffer_len}, state {block.get('state_dtype', 'fp32')}"
                          + ("" if same else f" (the block records {len(recorded)})")):
            return result
        try:
            pat_tokens, pat_logits = _generate(model, input_ids, new_tokens, pad_id, force=ref_tokens)
        except Exception as exc:  # the patched model must run wherever the stock one does
            result.add("run", False, f"the ReplaySSM model failed to decode: {_short(exc)}")
            return result
        progress.advance(key)

        # 4. compare
        scale = float(ref_logits.abs().max())
        tol = tolerance(dt, scale)
        if rs_config.torch_state_dtype is not None:  # a 16-bit checkpoint state rounds like 16-bit logits
            tol = max(tol, tolerance(rs_config.torch_state_dtype, scale))
        finite = bool(torch.isfinite(pat_logits).all())
        diff = float((pat_logits - ref_logits).abs().max()) if finite else float("inf")
        result.max_abs_diff, result.tolerance, result.logit_scale = diff, tol, scale
        steps = ref_logits.shape[1]
        if not finite:  # the stock logits are finite (checked above): this is ReplaySSM's fault
            row, step = (int(i) for i in (~torch.isfinite(pat_logits)).any(-1).nonzero()[0])
            result.add("logits", False, f"ReplaySSM logits are not finite (NaN/inf) from row {row} step {step} "
                                        f"of {batch}x{steps}, where the stock model's are finite")
            progress.finish(key)
            return result
        logits_ok = diff <= tol
        equal = ref_logits.argmax(-1) == pat_logits.argmax(-1)
        bad, margin, near_tie = _token_disagreements(ref_logits, pat_logits, tol)
        result.tokens_compared = int(equal.numel())
        result.tokens_equal = int(equal.sum())
        result.near_ties = int((~equal & near_tie).sum())
        flush_text = f"{_count(result.flushes, 'flush', 'flushes')} at L={rs_config.buffer_len}"
        if _rounds_checkpoint(rs_config):
            _fidelity_checks(result, ref_logits, pat_logits, flush_text, block)
        elif dt != torch.float32 and (not logits_ok or bool(bad.any())):
            _settle_against_fp32(result, model, input_ids, new_tokens, pad_id, ref_tokens, ref_logits, pat_logits,
                                 diff, tol, scale, flush_text)
        else:
            result.add("logits", logits_ok,
                       f"logits over {batch}x{steps} steps ({flush_text}): max |diff| {diff:.2e} <= tol {tol:.1e}"
                       if logits_ok else f"logits over {batch}x{steps} steps: max |diff| {diff:.2e} exceeds tol {tol:.1e}")
            ties = f" ({result.near_ties} differ at near ties)" if result.near_ties else ""
            if bad.any():
                row, step = (int(i) for i in bad.nonzero()[0])
                result.add("tokens", False, f"greedy tokens: {result.tokens_equal}/{result.tokens_compared} equal; "
                                            f"row {row} step {step} differs (top-2 margin {float(margin[row, step]):.2e})")
            else:
                result.add("tokens", True, f"greedy tokens: {result.tokens_equal}/{result.tokens_compared} equal{ties}")
        progress.advance(key)
        result.passed = all(c.ok for c in result.checks)
        progress.finish(key)
        return result
    finally:
        result.elapsed_s = time.perf_counter() - start


__all__ = ["Check", "ValidationResult", "resolve_device", "resolve_dtype", "tolerance", "validate_checkpoint"]
