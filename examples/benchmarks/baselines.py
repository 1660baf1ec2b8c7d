"""What the kernel benchmarks (``bench_kernels.py``, ``bench_verify.py``) time beside this checkout's
kernels: another checkout's kernels, and the per-step kernels of mamba_ssm, flash-linear-attention and
transformers (never dependencies of the package; each is used only where it loads, and reported as
absent otherwise)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import shutil
import sys
import tempfile
import types
from pathlib import Path

from run_record import UsageError

ROOT = Path(__file__).resolve().parents[2]
BASELINE = "replayssm_baseline_kernels"


def check_baseline_tree(path: str) -> None:
    """UsageError unless ``path`` is a ``kernels/`` directory (``--baseline-tree``)."""
    if not (Path(path) / "mamba2" / "__init__.py").is_file():
        raise UsageError(f"--baseline-tree: {path!r} is not a kernels/ directory (no mamba2/__init__.py)")


def load_baseline_tree(path: str) -> dict:
    """The ``mamba2`` and ``delta`` packages of another checkout's ``kernels/`` directory, imported as
    ``replayssm_baseline_kernels`` from a copy whose custom operators are renamed
    (``replayssm_baseline::...``), so that both trees' operators can be registered in one process."""
    dst = Path(tempfile.mkdtemp(prefix="bench_baseline_")) / BASELINE
    shutil.copytree(path, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for f in dst.rglob("*.py"):
        text = f.read_text()
        f.write_text(text.replace('"replayssm::', '"replayssm_baseline::').replace("torch.ops.replayssm.",
                                                                                    "torch.ops.replayssm_baseline."))
    sys.path.insert(0, str(dst.parent))
    return {"mamba2": importlib.import_module(f"{BASELINE}.mamba2"),
            "delta": importlib.import_module(f"{BASELINE}.delta")}


def load_mamba_ssm():
    """mamba_ssm's ``selective_state_update`` from ``.bench_vendor/`` (its package ``__init__`` needs
    CUDA extensions, so the one Triton file and its helper are loaded by path)."""
    vendor = ROOT / ".bench_vendor"
    ssu, sp = vendor / "selective_state_update.py", vendor / "softplus.py"
    if not (ssu.exists() and sp.exists()):
        return None, "absent (.bench_vendor/ not carried)"
    try:
        for name in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton"):
            if name not in sys.modules:
                m = types.ModuleType(name)
                m.__path__ = []
                sys.modules[name] = m
        mod = None
        for name, file in (("softplus", sp), ("selective_state_update", ssu)):
            spec = importlib.util.spec_from_file_location(f"mamba_ssm.ops.triton.{name}", file)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod
            spec.loader.exec_module(mod)
        return mod.selective_state_update, "mamba_ssm (vendored source, loaded by path)"
    except Exception as e:  # pragma: no cover - depends on the machine
        return None, f"failed to load: {type(e).__name__}: {e}"


def load_hf():
    """transformers' own decode functions: (Mamba-2 state update, Gated DeltaNet, KDA, a note)."""
    try:
        import transformers
    except Exception as e:  # pragma: no cover - machine dependent
        return None, None, None, f"transformers unavailable: {type(e).__name__}: {e}"
    found, notes = [], [f"transformers {transformers.__version__}"]
    for mod, names in (("transformers.models.mamba2.modeling_mamba2", ("mamba2_selective_state_update",)),
                       ("transformers.models.qwen3_5.modeling_qwen3_5", ("torch_recurrent_gated_delta_rule",)),
                       ("transformers.models.kimi_linear.modeling_kimi_linear",
                        ("recurrent_kimi_delta_attention", "torch_recurrent_kimi_delta_attention"))):
        fn = None
        try:
            m = importlib.import_module(mod)
            fn = next((inspect.unwrap(getattr(m, n)) for n in names if hasattr(m, n)), None)
        except Exception as e:  # pragma: no cover
            notes.append(f"{mod}: {type(e).__name__}")
        found.append(fn)
    return (*found, "; ".join(notes))


def load_fla():
    """flash-linear-attention's fused recurrent decode kernels ({"gdn": fn, "kda": fn}, a note)."""
    try:
        import fla
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fgdn

        try:
            from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd as fkda
        except Exception:
            fkda = None
        return {"gdn": fgdn, "kda": fkda}, f"flash-linear-attention (fla-core {getattr(fla, '__version__', '?')})"
    except Exception as e:
        return {}, f"not importable ({type(e).__name__}); skipped"
