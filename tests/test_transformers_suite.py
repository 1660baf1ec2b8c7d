"""scripts/transformers_suite.sh end to end, on a stand-in for a transformers source tree's tests/
whose test file builds models the way transformers' model tests do."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

STAND_IN = '''
import os

import torch
import transformers

import replayssm
from replayssm.tiny import tiny_config

PATCHED = os.environ["REPLAYSSM_SUITE"] == "patched"


def test_generate_runs_the_replay_path():
    model = transformers.AutoModelForCausalLM.from_config(tiny_config("tiny:nemotron_h")).eval()
    assert replayssm.is_patched(model) == PATCHED
    ids = torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert out.shape == (2, 11)


def test_the_outer_model_is_patched_not_its_inner_model_separately():
    model = transformers.AutoModelForCausalLM.from_config(tiny_config("tiny:nemotron_h"))
    names = [layer["name"] for layer in getattr(model.config, "replayssm", {"layers": []})["layers"]]
    # recorded relative to the base model, so that every class of the family resolves them
    assert all(model.base_model.get_submodule(name) is not None for name in names) and bool(names) == PATCHED


def test_without_ssm_layers():
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4))
    assert not replayssm.is_patched(model)


def test_stock_only():
    assert not replayssm.is_patched(transformers.AutoModelForCausalLM.from_config(tiny_config("tiny:nemotron_h")))
'''


def test_suite_script_patches_every_model_and_tabulates(tmp_path):
    tests = tmp_path / "transformers" / "tests"
    family = tests / "models" / "nemotron_h"
    family.mkdir(parents=True)
    for init in (tests, tests / "models", family):
        (init / "__init__.py").write_text("")
    (family / "test_modeling_nemotron_h.py").write_text(textwrap.dedent(STAND_IN))
    out = tmp_path / "results"
    env = dict(os.environ, REPLAYSSM_SUITE_OUT=str(out), REPLAYSSM_SUITE_K="", OMP_NUM_THREADS="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    run = subprocess.run(["bash", str(REPO / "scripts" / "transformers_suite.sh"), str(tests), "nemotron_h", "bamba"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr + run.stdout
    assert "bamba: no tests/models/bamba/test_modeling_bamba.py" in run.stderr
    table = (out / "RESULTS.md").read_text()
    assert "| nemotron_h | 4 / 0 / 0 | 3 / 1 / 0 | 1 / 1 | 1 |" in table, table
    assert "nemotron_h `test_modeling_nemotron_h::test_stock_only`: stock passed, patched failed" in table, table
    log = (out / "nemotron_h-patched.log").read_text()
    assert "4 tests; 3 built a patched model; 1 ran the replay decode path; 1 flushed a ring" in log, log


def test_suite_script_refuses_a_directory_without_models(tmp_path):
    run = subprocess.run(["bash", str(REPO / "scripts" / "transformers_suite.sh"), str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "usage:" in run.stderr
