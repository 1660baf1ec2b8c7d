"""``replayssm inspect``: tiny specs, directories and hub ids, as a table and as JSON."""

from __future__ import annotations

import shutil

import pytest

from cli_helpers import one_error, parse_json, tree_digest


@pytest.fixture(scope="module")
def inspected(cli_batch, tiny_dir, tmp_path_factory):
    """The console-script runs of this module, started together: name -> (Future, extra data)."""
    root = tmp_path_factory.mktemp("inspect")
    src = root / "ckpt"
    shutil.copytree(tiny_dir("bamba"), src)
    hub = root / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = hub / "models--acme--tiny-falcon-h1"
    shutil.copytree(tiny_dir("falcon_h1"), repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    hub_env = {"HF_HUB_CACHE": str(hub), "HF_HOME": str(root / "hf-home")}
    return {
        "table": (cli_batch("inspect", "tiny:nemotron_h"), None),
        "directory": (cli_batch("inspect", src, "--json"), (src, tree_digest(src))),
        "hub": (cli_batch("inspect", "acme/tiny-falcon-h1", "--json", env=hub_env), hub),
    }


def test_inspect_tiny_table(inspected):
    proc = inspected["table"][0].result()
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "NemotronHForCausalLM" in out and "NemotronHMamba2Mixer" in out
    assert "model.layers.0.mixer" in out and "model.layers.2.mixer" in out
    assert "Mamba-2" in out and "H8 P16 N16 G2" in out
    assert "8.0 KiB" in out  # 8 heads x 16 x 16 fp32 state per layer
    assert "can be rewritten" in out


def test_inspect_json_delta_rule_family(capsys):
    from replayssm.cli.main import main

    assert main(["inspect", "tiny:qwen3_next", "--json", "--buffer-len", "8"]) == 0
    info = parse_json(capsys.readouterr().out)
    assert info["ok"] is True and info["model_type"] == "qwen3_next"
    assert info["source"]["kind"] == "tiny" and info["buffer_len"] == 8
    layers = info["layers"]
    assert [row["name"] for row in layers] == [f"model.layers.{i}.linear_attn" for i in range(3)]
    for row in layers:
        assert row["kind"] == "gated_deltanet"
        assert row["shapes"] == {"num_k_heads": 2, "num_v_heads": 4, "head_k_dim": 16, "head_v_dim": 16}
        assert row["state_bytes"] == 4 * 16 * 16 * 4
        assert {"class_name", "can_rewrite", "reason", "buffer_bytes"} <= set(row)
    assert info["totals"]["state_bytes"] == sum(r["state_bytes"] for r in layers)


def test_inspect_unsupported_layers_show_the_reason():
    # in-process through typer's runner: the subprocess path is covered by the tests above
    from replayssm.cli.main import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["inspect", "tiny:jamba"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    assert "Mamba-1" in result.output and "JambaMambaMixer" in result.output
    assert "✗" in result.output and "not implemented" in result.output


def test_inspect_directory_reads_no_weights(inspected):
    future, (src, before) = inspected["directory"]
    proc = future.result()
    assert proc.returncode == 0, proc.stderr
    info = parse_json(proc.stdout)
    assert info["source"] == {"spec": str(src), "kind": "directory", "path": str(src)}
    assert info["architecture"] == "BambaForCausalLM"
    assert [r["name"] for r in info["layers"]] == ["model.layers.0.mamba", "model.layers.2.mamba",
                                                   "model.layers.3.mamba"]
    assert info["weights"]["ok"] is True and info["weights"]["files"] == 1
    assert tree_digest(src) == before


def test_inspect_hub_id_from_local_cache(inspected):
    """A hub id resolves to its snapshot in the local HF cache, offline."""
    proc = inspected["hub"][0].result()
    assert proc.returncode == 0, proc.stderr
    info = parse_json(proc.stdout)
    assert info["source"]["kind"] == "hub"
    assert info["architecture"] == "FalconH1ForCausalLM"


def test_convert_dry_run_from_hub_id(inspected, monkeypatch, capsys, tmp_path):
    from huggingface_hub import constants

    from replayssm.cli.main import main

    hub_cache = inspected["hub"][1]
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    before = tree_digest(hub_cache)
    assert main(["convert", "acme/tiny-falcon-h1", str(tmp_path / "out"), "--dry-run", "--json"]) == 0
    result = parse_json(capsys.readouterr().out)
    assert result["source"]["kind"] == "hub" and result["dry_run"] is True
    assert len(result["replayssm"]["layers"]) == 2
    assert not (tmp_path / "out").exists()
    assert tree_digest(hub_cache) == before


def test_hub_id_not_in_cache(capsys):
    from replayssm.cli.main import main

    assert main(["inspect", "acme/not-downloaded"]) == 2
    error, hint = one_error(capsys.readouterr().err)
    assert "acme/not-downloaded" in error and "local Hugging Face cache" in error
    assert hint and "download" in hint


def test_inspect_every_tiny_family_on_meta_device(monkeypatch):
    """In-process (a subprocess per family adds nothing): every tiny family inspects, no checkpoint written."""
    from replayssm.inspection import describe
    from replayssm.errors import ModelSpecError
    from replayssm.tiny import TINY_FAMILIES, tiny_config

    def no_materialize(*args, **kwargs):
        raise AssertionError("inspect must not write a tiny checkpoint")

    monkeypatch.setattr("replayssm.resolve.materialize_tiny", no_materialize)
    inspected = []
    for family in TINY_FAMILIES:
        try:
            tiny_config(f"tiny:{family}")
        except ModelSpecError:  # a family newer than the installed transformers
            continue
        info = describe(f"tiny:{family}")
        inspected.append(family)
        assert info["architecture"], family
        assert info["layers"], family
        for row in info["layers"]:
            assert row["state_bytes"] > 0, (family, row)
            assert row["can_rewrite"] or row["reason"], (family, row)
    assert {"mamba2", "nemotron_h", "bamba", "falcon_h1", "zamba2", "granitemoehybrid"} <= set(inspected)


@pytest.mark.parametrize("spec", ["tiny:mamba", "tiny:falcon_mamba", "tiny:zamba"])
def test_mamba1_families_are_found_but_not_rewritable(spec):
    from replayssm.inspection import describe

    info = describe(spec)
    assert info["rewritable"] == 0
    assert all(row["kind"] == "mamba1" and row["reason"] for row in info["layers"])
