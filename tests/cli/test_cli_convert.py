"""``replayssm convert``: happy paths through the console script, and the reload round trip."""

from __future__ import annotations

import json
import shutil

import pytest

from cli_helpers import file_sha, one_error, parse_json, tree_digest

MAMBA2_FAMILIES = ["mamba2", "nemotron_h", "bamba"]


def check_output(out, src, *, buffer_len=16, state_dtype="fp32"):
    """OUT_DIR = the input's files (weights byte for byte) with one config.json block added."""
    import replayssm

    src_files = {p.name for p in src.iterdir()}
    out_files = {p.name for p in out.iterdir()}
    assert out_files == src_files, (out_files, src_files)
    for name in src_files - {"config.json"}:
        assert file_sha(out / name) == file_sha(src / name), name
    original = json.loads((src / "config.json").read_text())
    converted = json.loads((out / "config.json").read_text())
    assert list(converted) == list(original) + ["replayssm"]  # same keys, same order, block appended
    assert {k: v for k, v in converted.items() if k != "replayssm"} == original
    block = converted["replayssm"]
    assert block["schema_version"] == replayssm.SCHEMA_VERSION
    assert block["package_version"] == replayssm.__version__
    assert block["buffer_len"] == buffer_len and block["state_dtype"] == state_dtype
    assert block["layers"] and all(set(entry) == {"name", "kind"} for entry in block["layers"])
    assert not [p for p in out.parent.iterdir() if ".replayssm-tmp-" in p.name]
    return block


@pytest.fixture(scope="module")
def converted(cli_batch, tiny_dir, tmp_path_factory):
    """converted(name) -> (source dir, OUT_DIR, CompletedProcess, source digest before).

    The conversions of this module are independent: they all start on first use.
    """
    runs = {}
    for family in MAMBA2_FAMILIES:
        src = tiny_dir(family)
        out = tmp_path_factory.mktemp(f"convert-{family}") / f"{family}-replay"
        runs[family] = (src, out, cli_batch("convert", f"tiny:{family}", out), tree_digest(src))
    src = tiny_dir("kimi_linear")
    out = tmp_path_factory.mktemp("convert-kimi") / "kimi"
    runs["kimi-json"] = (src, out, cli_batch("convert", src, out, "--json", "--buffer-len", "4",
                                             "--state-dtype", "bf16"), tree_digest(src))

    def get(name: str):
        src, out, future, before = runs[name]
        return src, out, future.result(), before

    return get


@pytest.mark.parametrize("family", MAMBA2_FAMILIES)
def test_convert_mamba2_families(family, converted):
    src, out, proc, before = converted(family)
    assert proc.returncode == 0, proc.stderr
    block = check_output(out, src)
    assert all(entry["kind"] == "mamba2" for entry in block["layers"])
    stdout = proc.stdout
    for check in ("✓ stock transformers loads the checkpoint", "✓ replayssm block applied",
                  "✓ logits over 2x24 steps", "✓ greedy tokens: 48/48 equal"):
        assert check in stdout, (check, stdout)
    assert "max |diff|" in stdout
    for entry in block["layers"]:  # the summary table names every rewritten layer
        assert entry["name"] in stdout
    assert "state bytes/seq" in stdout and "buffer bytes/seq" in stdout
    assert f"✓ wrote {out}" in stdout
    assert tree_digest(src) == before


def test_convert_json_delta_rule_family(converted):
    src, out, proc, before = converted("kimi-json")
    assert proc.returncode == 0, proc.stderr
    assert tree_digest(src) == before
    result = parse_json(proc.stdout)
    assert result["ok"] is True and result["written"] is True and result["dry_run"] is False
    assert result["out_dir"] == str(out) and result["source"]["kind"] == "directory"
    assert result["architecture"] == "KimiLinearForCausalLM"
    block = check_output(out, src, buffer_len=4, state_dtype="bf16")
    assert result["replayssm"] == block
    # the block names layers from the decoder stack on, valid in every class of the family
    assert [row["name"] for row in result["layers"]] == ["model." + entry["name"] for entry in block["layers"]]
    for row in result["layers"]:
        assert row["kind"] == "kda" and row["state_bytes"] > 0 and row["buffer_bytes"] > 0
    v = result["validation"]
    assert v["passed"] is True and v["flushes"] >= 5
    assert v["max_abs_diff"] <= v["tolerance"]
    assert [c["name"] for c in v["checks"]] == ["load", "patch", "logits", "tokens"]
    assert {f["name"] for f in result["files"]} == {p.name for p in out.iterdir()}
    assert result["weights_bytes"] == (src / "model.safetensors").stat().st_size


def test_dry_run_writes_nothing(capsys, tmp_path):
    from replayssm.cli.main import main

    out = tmp_path / "nested" / "out"
    args = ["convert", "tiny:granitemoehybrid", str(out), "--dry-run", "--json", "--layers", r"model\.layers\.[02]\.mamba"]
    assert main(args) == 0
    result = parse_json(capsys.readouterr().out)
    assert result["dry_run"] is True and result["written"] is False and result["validation"] is None
    assert [e["name"] for e in result["replayssm"]["layers"]] == ["layers.0.mamba", "layers.2.mamba"]
    assert result["unselected_layers"] == ["model.layers.3.mamba"]
    assert list(tmp_path.iterdir()) == []
    # the human-readable dry run lists the files it would write
    assert main(args[:-3] + args[-2:]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "dry run" in text and "model.safetensors" in text and "nothing was written" in text
    assert list(tmp_path.iterdir()) == []


def test_existing_out_dir_refused_then_replaced_with_force(run_cli, tiny_dir, tmp_path):
    src = tiny_dir("falcon_h1")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    proc = run_cli("convert", "tiny:falcon_h1", out, "--no-validate")
    assert proc.returncode == 2
    error, hint = one_error(proc.stderr)
    assert "already exists" in error and "--force" in hint
    assert proc.stdout == ""
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]

    proc = run_cli("convert", "tiny:falcon_h1", out, "--no-validate", "--force")
    assert proc.returncode == 0, proc.stderr
    assert not (out / "keep.txt").exists()
    check_output(out, src)
    assert "(not validated)" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_round_trip_convert_from_pretrained_generate(converted, tmp_path):
    """convert (console script) -> replayssm.from_pretrained -> generate == the original model."""
    import torch
    from transformers import AutoModelForCausalLM

    import replayssm

    src, out, proc, _ = converted("nemotron_h")
    assert proc.returncode == 0, proc.stderr

    original = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    stock = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()  # ignores the block
    model = replayssm.from_pretrained(out, dtype=torch.float32).eval()
    assert replayssm.is_patched(model) and not replayssm.is_patched(stock)
    report = replayssm.replayssm_report(model)
    assert report["config"].buffer_len == 16  # 32 new tokens cross two flushes
    assert [r.name for r in report["rewritten"]] == ["model.layers.0.mixer", "model.layers.2.mixer"]

    ids = torch.randint(3, 500, (2, 7), generator=torch.Generator().manual_seed(7))
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=32, min_new_tokens=32, do_sample=False,
                  pad_token_id=0)
    with torch.no_grad():
        expected = original.generate(ids, **kwargs)
        assert torch.equal(stock.generate(ids, **kwargs), expected)
        assert torch.equal(model.generate(ids, **kwargs), expected)

    # patch(AutoModelForCausalLM.from_pretrained(out)) reads the same block
    again = replayssm.patch(AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32))
    assert [r.name for r in replayssm.replayssm_report(again)["rewritten"]] == \
        [r.name for r in report["rewritten"]]

    # save_pretrained writes it back with its block, atomically
    saved = replayssm.save_pretrained(model, tmp_path / "saved")
    block = json.loads((saved / "config.json").read_text())["replayssm"]
    assert block == json.loads((out / "config.json").read_text())["replayssm"]
    reloaded = replayssm.from_pretrained(saved, dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(reloaded.generate(ids, **kwargs), expected)
    assert not [p for p in tmp_path.iterdir() if ".replayssm-tmp-" in p.name]
    with pytest.raises(replayssm.OutputExistsError):
        replayssm.save_pretrained(model, saved)
    shutil.rmtree(saved)


def test_cuda_graphs_recorded_in_the_block(capsys, tmp_path):
    from replayssm.cli.main import main

    args = ["convert", "tiny:qwen3_5", str(tmp_path / "out"), "--dry-run", "--json", "--cuda-graphs",
            "--graph-max-len", "512"]
    assert main(args) == 0
    block = parse_json(capsys.readouterr().out)["replayssm"]
    assert block["cuda_graphs"] is True and block["graph_max_len"] == 512
    assert main(args[:-3]) == 0
    block = parse_json(capsys.readouterr().out)["replayssm"]
    assert block["cuda_graphs"] is False and block["graph_max_len"] is None
    assert main(args[:-2] + ["1"]) == 2  # below the minimum: a usage error


@pytest.mark.parametrize("family,dtype,rounding", [("nemotron_h", "int8", "nearest"), ("qwen3_5", "fp8", "stochastic")])
def test_convert_validates_quantized_checkpoints_by_fidelity(capsys, tmp_path, family, dtype, rounding):
    """An 8-bit or stochastic checkpoint is validated by the teacher-forced fidelity criterion (mean
    |logit diff| in std units and greedy agreement), not by token equality; the block records it."""
    from replayssm.cli.main import main

    out = tmp_path / "out"
    args = ["convert", f"tiny:{family}", str(out), "--json", "--device", "cpu", "--buffer-len", "4",
            "--state-dtype", dtype, "--state-rounding", rounding, "--state-seed", "5"]
    assert main(args) == 0
    result = parse_json(capsys.readouterr().out)
    block = result["replayssm"]
    assert (block["state_dtype"], block["state_rounding"], block["state_seed"]) == (dtype, rounding, 5)
    checks = {c["name"]: c for c in result["validation"]["checks"]}
    assert checks["fidelity"]["ok"] and "std" in checks["fidelity"]["detail"] and "tokens" not in checks
