"""The library pieces behind ``replayssm convert``, in-process (no console script needed):
checkpoint scanning and verification, atomic output, memory use of the copy, progress hooks."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
import torch

from cli_helpers import file_sha, leftovers, perturb_logits, tree_digest


# --------------------------------------------------------------------------- helpers
def sharded_checkpoint(root: Path, *, vocab: int, max_shard_size: str) -> Path:
    """A tiny Mamba-2 checkpoint with a large vocabulary, saved in several safetensors shards."""
    from transformers import AutoModelForCausalLM

    from replayssm.tiny import tiny_config

    config = tiny_config("tiny:mamba2")
    config.vocab_size = vocab
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(root, max_shard_size=max_shard_size)
    return root


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    # embeddings and lm_head are 65536 x 64 fp32 = 16 MiB each: one shard apiece, plus the rest
    return sharded_checkpoint(tmp_path_factory.mktemp("sharded") / "ckpt", vocab=65536, max_shard_size="8MB")


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# --------------------------------------------------------------------------- scanning
def test_scan_sharded_checkpoint(sharded):
    from replayssm.checkpoint_dir import scan_checkpoint

    scan = scan_checkpoint(sharded)
    assert scan.index is not None and len(scan.weights) >= 3
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert {f.name for f in scan.weights} == set(index["weight_map"].values())
    assert scan.num_tensors == len(index["weight_map"])
    assert scan.weights_bytes == sum((sharded / f.name).stat().st_size for f in scan.weights)
    assert scan.largest_shard_bytes >= 16 * 2**20
    assert [f.name for f in scan.others] == ["generation_config.json"]


def test_scan_refuses_incomplete_or_inconsistent_checkpoints(sharded, tmp_path):
    from replayssm.checkpoint_dir import scan_checkpoint
    from replayssm.errors import CheckpointError

    bad = tmp_path / "missing-shard"
    shutil.copytree(sharded, bad)
    index = json.loads((bad / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[-1]
    (bad / victim).unlink()
    with pytest.raises(CheckpointError, match=f"lists {victim}, which is missing"):
        scan_checkpoint(bad)

    moved = tmp_path / "moved-tensor"
    shutil.copytree(sharded, moved)
    index = json.loads((moved / "model.safetensors.index.json").read_text())
    name, shard = next(iter(index["weight_map"].items()))
    other = next(s for s in set(index["weight_map"].values()) if s != shard)
    index["weight_map"][name] = other
    (moved / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="does not hold tensor"):
        scan_checkpoint(moved)


def test_bin_only_checkpoint_refused_with_hint(tiny_dir, tmp_path):
    from safetensors.torch import load_file

    from replayssm.checkpoint_dir import scan_checkpoint
    from replayssm.errors import CheckpointError

    src = tmp_path / "bin-only"
    src.mkdir()
    shutil.copy(tiny_dir("mamba2") / "config.json", src)
    torch.save(load_file(tiny_dir("mamba2") / "model.safetensors"), src / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="only PyTorch .bin weights") as info:
        scan_checkpoint(src)
    assert "save_pretrained" in info.value.hint


def test_tokenizer_and_small_files_copied_other_weights_skipped(tiny_dir, tmp_path):
    import replayssm
    from replayssm.checkpoint_dir import scan_checkpoint

    src = tmp_path / "both"
    shutil.copytree(tiny_dir("mamba2"), src)
    small = {"tokenizer.json": '{"version": "1.0"}', "tokenizer_config.json": "{}",
             "special_tokens_map.json": "{}", "chat_template.jinja": "{{ messages }}", "README.md": "# tiny\n"}
    for name, text in small.items():
        (src / name).write_text(text)
    (src / "pytorch_model.bin").write_bytes(b"pickle")
    (src / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    (src / "original").mkdir()
    scan = scan_checkpoint(src)
    assert {f.name for f in scan.others} >= set(small) | {"generation_config.json"}
    assert set(scan.skipped) == {"pytorch_model.bin", ".gitattributes", "original/"}
    before = tree_digest(src)
    result = replayssm.convert(src, tmp_path / "out", validate=False)
    out = tmp_path / "out"
    for name in list(small) + ["generation_config.json", "model.safetensors"]:
        assert file_sha(out / name) == file_sha(src / name), name
    assert not (out / "pytorch_model.bin").exists() and not (out / "original").exists()
    assert set(result.skipped_files) == {"pytorch_model.bin", ".gitattributes", "original/"}
    assert tree_digest(src) == before


def _header_bytes(header: dict, data_len: int) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * data_len


@pytest.mark.parametrize("header, data_len, message", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, 8, None),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, 4, "is truncated"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, 12, "after the last tensor"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, 8, "expected 12"),
    ({"a": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}}, 8, "unknown dtype"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, 8, "gap or overlap"),
    ({"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, 8, "gap or overlap"),
    ({"a": {"shape": [2]}}, 8, "no dtype/shape/data_offsets"),
])
def test_safetensors_header_checks(header, data_len, message, tmp_path):
    from replayssm.checkpoint_dir import read_safetensors_header
    from replayssm.errors import CheckpointError

    path = tmp_path / "x.safetensors"
    path.write_bytes(_header_bytes(header, data_len))
    if message is None:
        assert read_safetensors_header(path).data_len == 8
    else:
        with pytest.raises(CheckpointError, match=message):
            read_safetensors_header(path)


def test_safetensors_header_length_field_checks(tmp_path):
    from replayssm.checkpoint_dir import read_safetensors_header
    from replayssm.errors import CheckpointError

    path = tmp_path / "x.safetensors"
    path.write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match="shorter than a safetensors header"):
        read_safetensors_header(path)
    path.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with pytest.raises(CheckpointError, match="header length"):
        read_safetensors_header(path)
    path.write_bytes(struct.pack("<Q", 100) + b"{}")
    with pytest.raises(CheckpointError, match="is truncated"):
        read_safetensors_header(path)


# --------------------------------------------------------------------------- output directory
def test_atomic_output_dir_cleans_up_on_any_exception(tmp_path):
    from replayssm.output_dir import atomic_output_dir

    for exc in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with atomic_output_dir(tmp_path / "deep" / "er" / "out") as tmp:
                (tmp / "half.bin").write_bytes(b"x" * 100)
                raise exc
        assert leftovers(tmp_path) == []
    with atomic_output_dir(tmp_path / "deep" / "out") as tmp:
        (tmp / "done").write_text("ok")
    assert leftovers(tmp_path / "deep") == ["out"] and (tmp_path / "deep" / "out" / "done").read_text() == "ok"


def test_output_overlapping_the_input_is_refused_even_with_force(tiny_dir, tmp_path):
    import replayssm
    from replayssm.errors import OutputExistsError

    src = tmp_path / "ckpt"
    shutil.copytree(tiny_dir("mamba2"), src)
    before = tree_digest(src)
    for out in (src, src / "inside", tmp_path):
        with pytest.raises(OutputExistsError, match="overlaps the input"):
            replayssm.convert(src, out, force=True, validate=False)
    assert tree_digest(src) == before


_WRITER = """
import sys, time
from pathlib import Path
from replayssm.output_dir import atomic_output_dir
with atomic_output_dir(Path(sys.argv[1])) as tmp:
    (tmp / "model.safetensors").write_bytes(b"x" * 1000)
    print(tmp, flush=True)
    time.sleep(600)
"""


def start_writer(out: Path) -> tuple[subprocess.Popen, Path]:
    """A process in the middle of writing ``out`` (its temporary directory exists and is locked)."""
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(out)], stdout=subprocess.PIPE, text=True)
    return proc, Path(proc.stdout.readline().strip())


def test_leftovers_of_killed_runs_are_removed_and_busy_ones_kept(tiny_dir, tmp_path):
    """SIGKILL leaves the temporary directory (a full copy of the weights) behind; the next run
    removes it, but never a directory that a running process writes, nor one it cannot prove
    to be a leftover; all are named in the notes."""
    import replayssm

    tiny_dir("mamba2")
    out = tmp_path / "out"
    killed, killed_tmp = start_writer(out)
    busy, busy_tmp = start_writer(out)
    try:
        killed.kill()
        killed.wait()
        assert killed_tmp.is_dir() and (killed_tmp / "model.safetensors").is_file()  # what SIGKILL leaves
        unknown = tmp_path / ".out.replayssm-tmp-0123abcd"  # no lock file (an older version wrote it)
        unknown.mkdir()
        other = tmp_path / ".other.replayssm-tmp-0123abcd"  # another OUT_DIR's: not looked at
        other.mkdir()
        result = replayssm.convert("tiny:mamba2", out, validate=False, dry_run=True)
        assert killed_tmp.is_dir()  # a dry run removes nothing
        assert any("would remove 1 temporary directory" in n and killed_tmp.name in n for n in result.notes)
        result = replayssm.convert("tiny:mamba2", out, validate=False)
        assert not killed_tmp.exists()
        assert any("removed 1 temporary directory" in n and killed_tmp.name in n for n in result.notes), result.notes
        kept = next(n for n in result.notes if n.startswith("left "))
        assert str(busy_tmp) in kept and str(unknown) in kept and str(other) not in kept
        assert busy_tmp.is_dir() and unknown.is_dir() and other.is_dir() and (out / "config.json").is_file()
        assert busy.poll() is None
    finally:
        busy.kill()
        busy.wait()
    from replayssm.output_dir import remove_stale_temp_dirs

    assert remove_stale_temp_dirs(out) == ([busy_tmp], [unknown])  # its writer is gone now
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".other.replayssm-tmp-0123abcd", "out", unknown.name])


def test_a_published_output_dir_holds_no_lock_file(tmp_path):
    from replayssm.output_dir import LOCK_NAME, atomic_output_dir

    with atomic_output_dir(tmp_path / "out") as tmp:
        assert (tmp / LOCK_NAME).is_file()
        (tmp / "done").write_text("ok")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["done"]


# --------------------------------------------------------------------------- memory
def test_copy_memory_stays_below_one_shard(sharded, tmp_path):
    """convert (no validation) of a sharded checkpoint: Python-heap peak and RSS growth stay well
    below the largest shard, let alone the whole model."""
    import replayssm
    from replayssm.checkpoint_dir import scan_checkpoint

    scan = scan_checkpoint(sharded)
    largest, total = scan.largest_shard_bytes, scan.weights_bytes
    assert total > 2 * largest

    peak_rss = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak_rss[0] = max(peak_rss[0], rss_bytes())
            time.sleep(0.002)

    replayssm.convert(sharded, tmp_path / "warm", validate=False)  # imports and caches outside the measurement
    base_rss = rss_bytes()
    peak_rss[0] = base_rss
    sampler = threading.Thread(target=sample, daemon=True)
    tracemalloc.start()
    sampler.start()
    try:
        result = replayssm.convert(sharded, tmp_path / "out", validate=False)
        _, heap_peak = tracemalloc.get_traced_memory()
    finally:
        stop.set()
        sampler.join()
        tracemalloc.stop()
    assert result.written and result.largest_shard_bytes == largest
    for f in scan.weights:
        assert file_sha(tmp_path / "out" / f.name) == file_sha(sharded / f.name)
    assert heap_peak < largest / 2, (heap_peak, largest)
    assert peak_rss[0] - base_rss < largest, (peak_rss[0] - base_rss, largest)


# --------------------------------------------------------------------------- progress and results
class Recorder:
    def __init__(self):
        self.events = []

    def start(self, key, description, total=None, *, unit="steps"):
        self.events.append(("start", key, unit))

    def advance(self, key, amount=1):
        self.events.append(("advance", key, amount))

    def update(self, key, *, description=None, total=None):
        self.events.append(("update", key, total))

    def finish(self, key):
        self.events.append(("finish", key))


def test_progress_stages_and_byte_counts(sharded, tmp_path):
    import replayssm

    rec = Recorder()
    result = replayssm.convert(sharded, tmp_path / "out", validate=False, progress=rec)
    started = [e[1] for e in rec.events if e[0] == "start"]
    finished = [e[1] for e in rec.events if e[0] == "finish"]
    assert started == ["read", "copy", "save"] and finished == started
    copied = sum(e[2] for e in rec.events if e[0] == "advance" and e[1] == "copy")
    assert copied == result.weights_bytes
    assert sum(1 for e in rec.events if e[0] == "advance" and e[1] == "read") == len(
        [f for f in result.files if f.role == "weights"])


def test_validation_progress_and_result(tiny_dir, tmp_path):
    import replayssm

    rec = Recorder()
    result = replayssm.convert("tiny:mamba2", tmp_path / "out", buffer_len=3, progress=rec)
    assert [e[1] for e in rec.events if e[0] == "start"] == ["read", "copy", "save", "validate"]
    v = result.validation
    assert v.passed and v.flushes == (v.new_tokens - 1) // 3 and v.tokens_equal == v.tokens_compared
    assert v.max_abs_diff <= v.tolerance
    assert result.to_dict()["validation"]["checks"][-1]["name"] == "tokens"


def test_from_pretrained_and_save_pretrained_refusals(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    import replayssm

    with pytest.raises(replayssm.ConfigError, match="not a ReplaySSM checkpoint"):
        replayssm.from_pretrained(tiny_dir("mamba2"))
    model = AutoModelForCausalLM.from_pretrained(tiny_dir("mamba2"))
    with pytest.raises(replayssm.ConfigError, match="not patched"):
        replayssm.save_pretrained(model, tmp_path / "out")
    assert leftovers(tmp_path) == []


def test_tolerances():
    from replayssm.validate import resolve_dtype, tolerance

    assert tolerance(torch.float32, 30.0) == pytest.approx(3e-3)
    assert tolerance(torch.float32, 0.5) == pytest.approx(1e-4)
    assert tolerance(torch.bfloat16, 10.0) == pytest.approx(1.5)
    assert tolerance(torch.bfloat16, 10.0) > tolerance(torch.float16, 10.0) > tolerance(torch.float32, 10.0)
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu, {"dtype": "bfloat16"}) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda"), {"torch_dtype": "bfloat16"}) == torch.bfloat16
    assert resolve_dtype("fp16", cpu) == torch.float16


def test_unreadable_inputs(tiny_dir, tmp_path):
    """A shard that cannot be opened, a MODEL that is a file: one clear CheckpointError each."""
    import replayssm
    from replayssm.errors import CheckpointError

    src = tmp_path / "dangling"
    shutil.copytree(tiny_dir("mamba2"), src)
    (src / "model.safetensors").unlink()
    (src / "model.safetensors").symlink_to(tmp_path / "gone.safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors is a dangling symbolic link") as info:
        replayssm.convert(src, tmp_path / "out", validate=False)
    assert "gone.safetensors" in str(info.value) and "permission" not in info.value.hint
    with pytest.raises(CheckpointError, match="is a file, not a checkpoint directory"):
        replayssm.convert(tiny_dir("mamba2") / "config.json", tmp_path / "out", validate=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling"]


@pytest.mark.parametrize("which,passes", [("stock", True), ("replay", False)])
def test_16bit_validation_is_settled_against_the_fp32_model(tiny_dir, tmp_path, monkeypatch, which, passes):
    """A 16-bit comparison that fails against the stock model is decided by an fp32 decode:
    it passes when the stock 16-bit logits are the further from the fp32 ones (a noisier stock
    path), and fails when ReplaySSM's are."""
    import replayssm

    perturb_logits(monkeypatch, which)
    tiny_dir("nemotron_h")
    out = tmp_path / "out"
    if passes:
        result = replayssm.convert("tiny:nemotron_h", out, device="cpu", dtype="bf16", buffer_len=4)
        v = result.validation
        assert v.passed and v.oracle == "fp32" and v.max_abs_diff > v.tolerance
        assert v.oracle_patched_diff < v.oracle_stock_diff
        assert result.to_dict()["validation"]["oracle"] == "fp32"
        assert out.is_dir()
    else:
        with pytest.raises(replayssm.ValidationFailedError, match="ReplaySSM is the further"):
            replayssm.convert("tiny:nemotron_h", out, device="cpu", dtype="bf16", buffer_len=4)
        assert not out.exists()


def test_fp32_validation_has_no_oracle_fallback(tiny_dir, tmp_path, monkeypatch):
    """In fp32 the stock model is the oracle: a noisier stock decode fails the check."""
    import replayssm

    perturb_logits(monkeypatch, "stock")
    tiny_dir("nemotron_h")
    with pytest.raises(replayssm.ValidationFailedError, match="exceeds tol"):
        replayssm.convert("tiny:nemotron_h", tmp_path / "out", device="cpu", dtype="fp32", buffer_len=4)


def test_missing_from_pretrained_path_is_this_tools_error(tmp_path):
    import replayssm

    with pytest.raises(replayssm.ModelSpecError, match="no such directory"):
        replayssm.from_pretrained(tmp_path / "missing")
    with pytest.raises(replayssm.ModelSpecError, match="no such directory"):
        replayssm.from_pretrained("/definitely/missing")
    with pytest.raises(replayssm.CheckpointError, match="has no config.json"):
        replayssm.from_pretrained(tmp_path)


def test_config_without_model_type_is_named(tiny_dir, tmp_path):
    import replayssm
    from replayssm.inspection import describe

    src = tmp_path / "src"
    shutil.copytree(tiny_dir("mamba2"), src)
    config = json.loads((src / "config.json").read_text())
    del config["model_type"]
    (src / "config.json").write_text(json.dumps(config))
    for call in (lambda: describe(str(src)), lambda: replayssm.convert(src, tmp_path / "out")):
        with pytest.raises(replayssm.CheckpointError, match="config.json has no model_type") as info:
            call()
        assert "upgrade" not in info.value.hint


# --------------------------------------------------------------------------- non-finite values
def test_non_finite_weights_are_named_not_blamed_on_replayssm(tiny_dir, tmp_path, capsys):
    """A checkpoint whose own weights hold NaN: a usage error naming the tensor, not a failed
    validation with "max |diff| inf" and "report it"."""
    from safetensors.torch import load_file, save_file

    import replayssm
    from replayssm.cli.main import main

    src = tmp_path / "nan"
    shutil.copytree(tiny_dir("mamba2"), src)
    tensors = load_file(src / "model.safetensors")
    name = next(k for k in tensors if k.endswith("layers.0.mixer.in_proj.weight"))
    tensors[name][0, 0] = float("nan")
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(replayssm.CheckpointError, match="weights are not finite") as info:
        replayssm.convert(src, tmp_path / "out")
    assert name in str(info.value) and "report" not in info.value.hint
    assert main(["convert", str(src), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "weights are not finite" in err and "max |diff|" not in err and "--dtype fp32" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nan"]


def test_non_finite_replayssm_logits_fail_validation_as_such(tiny_dir, tmp_path, monkeypatch):
    import replayssm
    import replayssm.validate as validate

    real = validate._generate

    def nan_when_patched(model, input_ids, new_tokens, pad_id, force=None):
        tokens, logits = real(model, input_ids, new_tokens, pad_id, force=force)
        if replayssm.is_patched(model):
            logits[1, 5:] = float("nan")
        return tokens, logits

    monkeypatch.setattr(validate, "_generate", nan_when_patched)
    tiny_dir("mamba2")
    with pytest.raises(replayssm.ValidationFailedError, match="ReplaySSM logits are not finite") as info:
        replayssm.convert("tiny:mamba2", tmp_path / "out", device="cpu", dtype="fp32")
    assert "row 1 step 5" in str(info.value)
    assert "--dtype fp32" not in info.value.hint and "report it" in info.value.hint  # already fp32
    assert [c.name for c in info.value.validation.checks] == ["load", "patch", "logits"]


# --------------------------------------------------------------------------- sizes
def test_tiny_spec_and_its_checkpoint_directory_describe_the_same(tiny_dir):
    from replayssm.inspection import describe

    spec, directory = describe("tiny:bamba", buffer_len=8), describe(str(tiny_dir("bamba")), buffer_len=8)
    assert spec["act_dtype"] == directory["act_dtype"] == "fp32"
    assert not spec["act_dtype_assumed"] and not directory["act_dtype_assumed"]
    assert spec["totals"] == directory["totals"]
    assert [r["buffer_bytes"] for r in spec["layers"]] == [r["buffer_bytes"] for r in directory["layers"]]


def test_assumed_activation_dtype_is_said(tiny_dir, tmp_path, capsys):
    from replayssm.cli.main import main
    from replayssm.inspection import describe

    src = tmp_path / "no-dtype"
    shutil.copytree(tiny_dir("bamba"), src)
    config = json.loads((src / "config.json").read_text())
    config.pop("dtype", None)
    config.pop("torch_dtype", None)
    (src / "config.json").write_text(json.dumps(config))
    info = describe(str(src))
    assert info["act_dtype"] == "bf16" and info["act_dtype_assumed"] and info["act_bytes"] == 2
    assert main(["inspect", str(src)]) == 0
    assert "bf16 assumed: config.json records no dtype" in capsys.readouterr().out
    assert main(["convert", str(src), str(tmp_path / "out"), "--dry-run"]) == 0
    assert "assumed: config.json records no dtype" in capsys.readouterr().out
