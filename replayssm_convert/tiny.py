"""Built-in tiny checkpoints: ``tiny:<model_type>`` model specs.

``materialize_tiny("tiny:nemotron_h")`` writes (once, deterministically, offline) a real
Hugging Face checkpoint directory — ``config.json``, ``generation_config.json`` and
``model.safetensors`` — of a small random fp32 model of that family, and returns its path.
The recurrences get slow decays (real memory over tens of tokens) so that a wrong
flush shows up in the outputs, and the output head gets a wide logit spread so that
greedy decoding is not decided by rounding noise.

The cache (``$REPLAYSSM_CACHE/tiny``, else ``~/.cache/replayssm/tiny``) keeps, beside each
checkpoint directory, a manifest of its files' sizes and SHA-256 digests; an entry that no
longer matches it (a damaged or half-deleted file) is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable

from .errors import CacheError, ModelSpecError

TINY_PREFIX = "tiny:"
TINY_FORMAT_VERSION = 2
CACHE_ENV = "REPLAYSSM_CACHE"
#: the dtype tiny checkpoints are written in (their config.json records it)
TINY_DTYPE = "float32"
VOCAB = 512
HIDDEN = 64
_COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, pad_token_id=0, bos_token_id=1, eos_token_id=2,
               tie_word_embeddings=False, dtype=TINY_DTYPE)
_LIN3FULL = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]


@dataclass(frozen=True)
class TinyFamily:
    """A model family: its ``model_type``, the layer kind of its SSM layers (a name in
    ``replayssm.patches.kinds.KINDS``), how many SSM layers its tiny model has, and the
    builder of its tiny config."""

    model_type: str
    kind: str
    ssm_layers: int
    build_config: Callable[[], Any]


#: model_type -> family, in declaration order: Mamba-2, delta-rule, then Mamba-1 families
TINY_FAMILIES: dict[str, TinyFamily] = {}


def declare_family(model_type: str, kind: str, *, ssm_layers: int):
    """Declare a family: decorates the builder of its tiny config."""
    def register(build: Callable[[], Any]) -> Callable[[], Any]:
        TINY_FAMILIES[model_type] = TinyFamily(model_type, kind, ssm_layers, build)
        return build
    return register


def _cfg(cls_name: str, **kwargs) -> Any:
    import transformers

    cls = getattr(transformers, cls_name, None)
    if cls is None:
        raise ModelSpecError(
            f"the installed transformers {transformers.__version__} has no {cls_name}",
            hint="upgrade transformers, or pick another tiny: family (replayssm inspect --help lists them)",
        )
    return cls(**_COMMON, **kwargs)


@declare_family("mamba2", "mamba2", ssm_layers=2)
def _mamba2():
    return _cfg("Mamba2Config", num_hidden_layers=2, num_heads=8, head_dim=16, state_size=16, n_groups=2,
                expand=2, chunk_size=16, conv_kernel=4)


@declare_family("nemotron_h", "mamba2", ssm_layers=2)
def _nemotron_h():
    return _cfg("NemotronHConfig", layers_block_type=["linear_attention", "full_attention", "linear_attention", "mlp"],
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128, ssm_state_size=16,
                mamba_num_heads=8, mamba_head_dim=16, n_groups=2, chunk_size=16, n_routed_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=32, moe_shared_expert_intermediate_size=32)


@declare_family("bamba", "mamba2", ssm_layers=3)
def _bamba():
    return _cfg("BambaConfig", intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2,
                mamba_d_state=16, mamba_chunk_size=16)


@declare_family("falcon_h1", "mamba2", ssm_layers=2)
def _falcon_h1():
    return _cfg("FalconH1Config", intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2,
                mamba_d_state=16, mamba_chunk_size=16, ssm_out_multiplier=50.0)


@declare_family("zamba2", "mamba2", ssm_layers=4)
def _zamba2():
    return _cfg("Zamba2Config", intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=4, mamba_d_state=16, n_mamba_heads=8, mamba_ngroups=2, chunk_size=16,
                use_mamba_kernels=False, hybrid_layer_ids=[1, 3],
                layers_block_type=["linear_attention", "hybrid", "linear_attention", "hybrid"])


@declare_family("granitemoehybrid", "mamba2", ssm_layers=3)
def _granitemoehybrid():
    return _cfg("GraniteMoeHybridConfig", intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=64,
                layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
                mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_chunk_size=16)


_GDN = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
_ATT = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)


@declare_family("qwen3_next", "gated_deltanet", ssm_layers=3)
def _qwen3_next():
    return _cfg("Qwen3NextConfig", intermediate_size=128, num_hidden_layers=4, **_ATT, **_GDN, **_MOE,
                layer_types=_LIN3FULL)


@declare_family("qwen3_5", "gated_deltanet", ssm_layers=3)
def _qwen3_5():
    return _cfg("Qwen3_5TextConfig", intermediate_size=128, num_hidden_layers=4, **_ATT, **_GDN,
                layer_types=_LIN3FULL)


@declare_family("qwen3_5_moe", "gated_deltanet", ssm_layers=3)
def _qwen3_5_moe():
    return _cfg("Qwen3_5MoeTextConfig", num_hidden_layers=4, **_ATT, **_GDN, **_MOE, layer_types=_LIN3FULL)


@declare_family("qwen4_exp", "gated_deltanet", ssm_layers=3)
def _qwen4_exp():
    return _cfg("Qwen4ExpTextConfig", num_hidden_layers=4, **_ATT, **_GDN, **_MOE, layer_types=_LIN3FULL,
                indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=16,
                indexer_compress_ratio=4)


@declare_family("lara_mini", "gated_deltanet", ssm_layers=3)
def _lara_mini():  # transformers 5.25+; its sliding-window attention layer stays on sdpa
    return _cfg("LaraMiniConfig", num_hidden_layers=5, **_ATT, **_GDN, **_MOE, sliding_window=8,
                layer_types=["linear_attention", "sliding_attention", "linear_attention", "full_attention",
                             "linear_attention"])


@declare_family("olmo_hybrid", "gated_deltanet", ssm_layers=3)
def _olmo_hybrid():
    return _cfg("OlmoHybridConfig", intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=4, linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=16,
                linear_value_head_dim=32, layer_types=_LIN3FULL)


_MLA = dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, linear_num_heads=4,
            linear_head_dim=16, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=4,
            intermediate_size=128, moe_intermediate_size=32, layer_types=_LIN3FULL,
            mlp_layer_types=["dense", "sparse", "sparse", "sparse"])


@declare_family("kimi_linear", "kda", ssm_layers=3)
def _kimi_linear():
    return _cfg("KimiLinearConfig", **_MLA, num_experts=4, num_experts_per_token=2, num_shared_experts=1)


@declare_family("bailing_hybrid", "kda", ssm_layers=3)
def _bailing_hybrid():
    return _cfg("BailingHybridConfig", **_MLA, num_experts=4, num_experts_per_token=2, num_shared_experts=1,
                num_expert_group=1, topk_group=1, first_k_dense_replace=1, num_nextn_predict_layers=0)


@declare_family("glm5_next", "kda", ssm_layers=3)
def _glm5_next():
    import transformers

    if not hasattr(transformers, "Glm5NextConfig"):
        raise ModelSpecError(f"the installed transformers {transformers.__version__} has no Glm5NextConfig")
    def text_config(attention):
        return transformers.Glm5NextTextConfig(
            **_COMMON, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, kv_lora_rank=16,
            q_lora_rank=32, qk_rope_head_dim=0, qk_nope_head_dim=16, v_head_dim=16, index_topk=16, index_kpool=4,
            index_head_dim=16, index_n_heads=2, linear_num_heads=4, linear_head_dim=16,
            layer_types=_LIN3FULL[:3] + [attention], mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
            indexer_types=["full"] * 4)

    try:
        text = text_config("indexed_attention")  # 5.23+
    except Exception:  # a ValueError, or huggingface_hub's strict-dataclass validation error
        text = text_config("deepseek_sparse_attention")  # 5.17 names the same layer type so
    vision = transformers.Glm5NextVisionConfig(depth=1, hidden_size=32, num_heads=2, intermediate_size=64,
                                               out_hidden_size=HIDDEN, projection_intermediate_size=64)
    return transformers.Glm5NextConfig(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                       tie_word_embeddings=False, dtype=TINY_DTYPE)


@declare_family("mamba", "mamba1", ssm_layers=2)
def _mamba():
    return _cfg("MambaConfig", state_size=8, num_hidden_layers=2, expand=2, time_step_rank=8, intermediate_size=128)


@declare_family("falcon_mamba", "mamba1", ssm_layers=2)
def _falcon_mamba():
    return _cfg("FalconMambaConfig", state_size=8, num_hidden_layers=2, expand=2, time_step_rank=8,
                intermediate_size=128)


@declare_family("jamba", "mamba1", ssm_layers=2)
def _jamba():
    return _cfg("JambaConfig", intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, expert_layer_period=2,
                expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1, mamba_d_state=8, mamba_dt_rank=8,
                use_mamba_kernels=False)


@declare_family("zamba", "mamba1", ssm_layers=4)
def _zamba():
    return _cfg("ZambaConfig", intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=4, attention_hidden_size=128, attention_head_dim=32, n_mamba_heads=2,
                mamba_d_state=8, mamba_dt_rank=8, use_mamba_kernels=False,
                layers_block_type=["linear_attention", "hybrid", "linear_attention", "hybrid"])


_GENERATING_AUTOS = ("AutoModelForCausalLM", "AutoModelForImageTextToText")
_GENERATING_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")


def model_class_for(config):
    """The transformers class that builds a generating model for ``config``.

    ``AutoModelForCausalLM``'s class where it knows the config, else
    ``AutoModelForImageTextToText``'s (composite models such as GLM5-Next, which only have
    ``...ForConditionalGeneration``), else a generating class named in ``config.architectures``
    (a checkpoint saved from the base model names the base model there).
    """
    import transformers

    for auto in _GENERATING_AUTOS:
        mapping = getattr(getattr(transformers, auto, None), "_model_mapping", None)
        try:
            return mapping[type(config)]
        except (KeyError, TypeError):
            continue
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None and name.endswith(_GENERATING_SUFFIXES):
            return cls
    raise ModelSpecError(f"transformers {transformers.__version__} has no generating model class for "
                         f"model_type {getattr(config, 'model_type', '?')!r}")


def is_tiny_spec(spec: str) -> bool:
    return isinstance(spec, str) and spec.startswith(TINY_PREFIX)


def tiny_family(spec: str) -> str:
    """``"tiny:bamba"`` -> ``"bamba"``; raises ModelSpecError for unknown families."""
    name = spec[len(TINY_PREFIX):] if is_tiny_spec(spec) else spec
    if name not in TINY_FAMILIES:
        raise ModelSpecError(
            f"unknown tiny model {spec!r}; expected tiny:<model_type> with one of: {', '.join(TINY_FAMILIES)}",
        )
    return name


def tiny_config(spec: str):
    """The transformers config object of a tiny family (no weights)."""
    return TINY_FAMILIES[tiny_family(spec)].build_config()


def _slow_decays(model) -> None:
    """Give every recurrence slow decays (memory of tens of tokens) and widen the logits."""
    import torch

    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, mod in model.named_modules():
            a_log = getattr(mod, "A_log", None)
            if isinstance(a_log, torch.nn.Parameter):
                # A = -exp(A_log) in [-0.3, -0.02] (Mamba-2 / GDN / KDA): exp(A * dt) close to 1
                u = torch.rand(a_log.shape, generator=gen) * (math.log(0.3) - math.log(0.02)) + math.log(0.02)
                a_log.copy_(u.to(a_log.dtype))
            dt_bias = getattr(mod, "dt_bias", None)
            if isinstance(dt_bias, torch.nn.Parameter):
                # softplus(dt_bias) in about [0.05, 0.5]
                dt = torch.rand(dt_bias.shape, generator=gen) * 0.45 + 0.05
                dt_bias.copy_((dt + torch.log(-torch.expm1(-dt))).to(dt_bias.dtype))
            if a_log is not None and hasattr(mod, "D") and hasattr(mod, "in_proj"):
                # Mamba-2 mixers: make the state term, not the D skip, carry the output
                mod.D.mul_(0.1)
                mod.in_proj.weight.mul_(3.0)
                mod.out_proj.weight.mul_(4.0)
        out = model.get_output_embeddings()
        if out is not None and getattr(out, "weight", None) is not None:
            out.weight.mul_(8.0)


def build_tiny_model(spec: str, dtype=None):
    """Build the tiny model in memory (deterministic: seed 0), in ``dtype`` (default fp32)."""
    import torch

    dtype = dtype or torch.float32
    config = tiny_config(spec)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(0)
        cls = model_class_for(config)
        model = cls._from_config(config, dtype=torch.float32) if hasattr(cls, "_from_config") else cls(config)
        _slow_decays(model)
    finally:
        torch.random.set_rng_state(state)
    return model.to(dtype).eval()


def tiny_cache_root() -> Path:
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root).expanduser() / "tiny"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "replayssm" / "tiny"


def _cache_error(path: Path, exc: OSError, *, damaged: Path | None = None) -> CacheError:
    reason = "permission denied" if isinstance(exc, PermissionError) else \
        "a file is in the way" if isinstance(exc, (FileExistsError, NotADirectoryError)) else \
        (exc.strerror or str(exc)).lower()
    where = (f"${CACHE_ENV} is {os.environ[CACHE_ENV]}" if os.environ.get(CACHE_ENV)
             else f"${CACHE_ENV} is not set, so the cache is {tiny_cache_root()}")
    if damaged is not None:
        return CacheError(f"the cached tiny checkpoint {damaged} is damaged and cannot be rebuilt: cannot write "
                          f"{path} ({reason})",
                          hint=f"delete {damaged}, or set {CACHE_ENV} to a writable directory ({where})")
    return CacheError(f"cannot write the tiny-model cache: {path} ({reason})",
                      hint=f"set {CACHE_ENV} to a writable directory ({where})")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _manifest_of(directory: Path) -> dict[str, Any]:
    files = {p.name: {"bytes": p.stat().st_size, "sha256": _digest(p)} for p in sorted(directory.iterdir())
             if p.is_file()}
    return {"format_version": TINY_FORMAT_VERSION, "files": files}


def _intact(target: Path, manifest_path: Path) -> bool:
    """Whether ``target`` holds exactly the files its manifest lists, byte for byte."""
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = manifest["files"]
        if "config.json" not in files or "model.safetensors" not in files:
            return False
        for name, want in files.items():
            path = target / name
            if path.stat().st_size != want["bytes"] or _digest(path) != want["sha256"]:
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)


def materialize_tiny(spec: str, root: Path | None = None) -> Path:
    """Write the tiny checkpoint directory once and return its path (atomic: tmp dir + rename).

    An entry that does not match its manifest is rebuilt (the build is deterministic).
    Raises CacheError, naming ``$REPLAYSSM_CACHE``, when the cache cannot be written.
    """
    import transformers

    family = tiny_family(spec)
    root = Path(root) if root is not None else tiny_cache_root()
    target = root / f"{family}-v{TINY_FORMAT_VERSION}-tf{transformers.__version__}"
    manifest_path = root / f"{target.name}.manifest.json"
    if _intact(target, manifest_path):
        return target
    damaged = target if target.exists() else None
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{family}-", dir=root))
    except OSError as exc:
        raise _cache_error(root, exc, damaged=damaged) from None
    try:
        build_tiny_model(spec).save_pretrained(tmp, safe_serialization=True)
        manifest = _manifest_of(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # a damaged entry, or another process wrote the same (deterministic) files first
            if not (target.is_dir() and _manifest_of(target) == manifest):
                stale = Path(tempfile.mkdtemp(prefix=f".{family}-damaged-", dir=root))
                os.rename(target, stale / target.name)
                os.rename(tmp, target)
                shutil.rmtree(stale, ignore_errors=True)
        _write_manifest(manifest_path, manifest)
    except OSError as exc:
        raise _cache_error(root, exc, damaged=damaged) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
