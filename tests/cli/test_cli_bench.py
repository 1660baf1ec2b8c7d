"""``replayssm bench``: the smoke run through the console script (table, JSON, plot), option errors
before torch is imported, the timing arithmetic, out-of-memory rows, the presets' sizes, and on a
GPU the CUDA-graph variants."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types

import pytest
import torch

from cli_helpers import one_error, parse_json

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def smoke(cli_batch, tmp_path_factory):
    """The console-script smoke runs of this module, started together."""
    work = tmp_path_factory.mktemp("bench")
    files = {"json": work / "bench.json", "plot": work / "bench.png"}
    return {
        "files": files,
        "run": cli_batch("bench", "tiny:nemotron_h", "--smoke", "--json", files["json"],
                         *(["--plot", files["plot"]] if HAS_MATPLOTLIB else [])),
        "stdout": cli_batch("bench", "tiny:qwen3_5", "--smoke", "--batch-sizes", "3", "--variants", "eager,graphs",
                            "--json", "-"),
    }


def _ok_rows(data):
    return [r for r in data["rows"] if r["status"] == "ok"]


def test_smoke_run_prints_the_table(smoke):
    proc = smoke["run"].result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    header = next(ln for ln in lines if "variant" in ln and "ms/step" in ln)
    for column in ("batch", "tokens/s", "vs stock", "vs eager", "prefill ms", "peak mem", "capture s", "note"):
        assert column in header, column
    assert "tiny:nemotron_h" in proc.stdout and "fp32 weights" in proc.stdout and "L=4" in proc.stdout
    # one row per batch size x variant; the graph variants are not timed on the CPU
    cells = [ln.split() for ln in lines if ln.split()[:1] in (["1"], ["2"], ["stock"], ["eager"], ["graphs"],
                                                             ["graphs-per-step"])]
    variants = [c[1] if c[0].isdigit() else c[0] for c in cells]
    assert variants == ["stock", "eager", "graphs", "graphs-per-step"] * 2, proc.stdout
    graph_lines = [ln for ln in lines if ln.split()[:1] in (["graphs"], ["graphs-per-step"])]
    assert len(graph_lines) == 4 and all(ln.rstrip().endswith("n/a: needs CUDA") for ln in graph_lines)
    assert "torch " in proc.stdout and "transformers " in proc.stdout  # the versions line
    assert f"wrote {smoke['files']['json']}" in proc.stdout


def test_smoke_run_writes_the_json(smoke):
    proc = smoke["run"].result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(smoke["files"]["json"].read_text())
    assert data["ok"] is True and data["device"] == "cpu" and data["gpu"] is None
    assert data["date"].endswith("UTC")
    assert data["versions"]["torch"] == torch.__version__
    assert {"triton", "transformers", "replayssm", "python"} <= set(data["versions"])
    assert data["command"].startswith("replayssm bench tiny:nemotron_h --batch-sizes 1,2 ")
    assert "--buffer-len 4" in data["command"] and "--device cpu" in data["command"]
    s = data["settings"]
    assert (s["batch_sizes"], s["new_tokens"], s["first_tokens"], s["dtype"], s["repeats"]) == ([1, 2], 24, 4,
                                                                                                "fp32", 3)
    assert data["model"]["architecture"] == "NemotronHForCausalLM" and data["model"]["parameters"] > 0
    rows = {(r["batch_size"], r["variant"]): r for r in data["rows"]}
    assert sorted(rows) == sorted((b, v) for b in (1, 2) for v in ("stock", "eager", "graphs", "graphs-per-step"))
    for b in (1, 2):
        stock, eager = rows[b, "stock"], rows[b, "eager"]
        for r in (stock, eager):
            assert r["status"] == "ok" and r["ms_per_step"] > 0 and r["prefill_ms"] > 0
            assert r["tokens_per_s"] == pytest.approx(b / (r["ms_per_step"] / 1e3))
            assert r["peak_memory_bytes"] is None and r["capture_s"] is None  # no CUDA
            assert len(r["step_ms_samples"]) == 3
        assert eager["speedup_vs_stock"] == pytest.approx(stock["ms_per_step"] / eager["ms_per_step"])
        assert stock["speedup_vs_eager"] == pytest.approx(eager["ms_per_step"] / stock["ms_per_step"])
        for v in ("graphs", "graphs-per-step"):
            assert rows[b, v]["status"] == "n/a" and rows[b, v]["note"] == "needs CUDA"
            assert rows[b, v]["ms_per_step"] is None and rows[b, v]["tokens_per_s"] is None
    # written atomically: no temporary file left beside it
    assert sorted(p.name for p in smoke["files"]["json"].parent.iterdir()) == sorted(
        p.name for p in smoke["files"].values() if p.exists())


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed (pip install 'replayssm[bench]')")
def test_smoke_run_writes_the_plot(smoke):
    proc = smoke["run"].result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    png = smoke["files"]["plot"].read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 5000
    assert f"wrote {smoke['files']['plot']}" in proc.stdout


def test_json_to_stdout_keeps_stdout_one_document(smoke):
    proc = smoke["stdout"].result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = parse_json(proc.stdout)
    assert [(r["batch_size"], r["variant"], r["status"]) for r in data["rows"]] == [(3, "eager", "ok"),
                                                                                    (3, "graphs", "n/a")]
    assert data["rows"][0]["speedup_vs_stock"] is None  # stock was not asked for
    assert "ms/step" in proc.stderr  # the table went to stderr


def test_without_matplotlib_the_plot_is_one_line_and_the_table_still_prints(tmp_path, monkeypatch, capsys):
    import replayssm.bench_output
    from replayssm.cli.main import main

    monkeypatch.setattr(replayssm.bench_output, "matplotlib_available", lambda: False)
    target = tmp_path / "p.png"
    code = main(["bench", "tiny:mamba2", "--smoke", "--batch-sizes", "1", "--variants", "stock", "--plot",
                 str(target)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    notes = [ln for ln in captured.err.splitlines() if "matplotlib" in ln]
    assert len(notes) == 1 and "pip install 'replayssm[bench]'" in notes[0]
    assert "ms/step" in captured.out and not target.exists()


def test_a_failed_cell_is_shown_and_the_exit_code_is_one(monkeypatch, capsys):
    import replayssm.bench
    from replayssm.cli.main import main

    real = replayssm.bench._measure

    def measure(model, row, *args):
        if row.batch_size == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB.")
        return real(model, row, *args)

    monkeypatch.setattr(replayssm.bench, "_measure", measure)
    code = main(["bench", "tiny:mamba2", "--smoke", "--variants", "eager", "--batch-sizes", "1,2,3"])
    captured = capsys.readouterr()
    assert code == 1, captured.err
    lines = captured.out.splitlines()
    assert any(ln.split()[:2] == ["1", "eager"] and "ms/step" not in ln for ln in lines)
    assert any(ln.split()[:2] == ["2", "eager"] and ln.rstrip().endswith("out of memory") for ln in lines)
    assert any(ln.split()[:2] == ["3", "eager"] and ln.rstrip().endswith("skipped: batch 2 ran out of memory")
               for ln in lines)
    assert "2 of 3 cells failed" in captured.err


BAD = [
    (["--preset", "nope"], "unknown preset 'nope'; expected one of: nemotron3-nano-like"),
    (["tiny:qwen3_5", "--preset", "qwen3.5-4b-like"], "either MODEL or --preset, not both"),
    ([], "give MODEL"),
    (["tiny:qwen3_5", "--batch-sizes", "0"], "--batch-sizes must be positive"),
    (["tiny:qwen3_5", "--batch-sizes", "1,x"], "--batch-sizes must be a comma-separated list"),
    (["tiny:qwen3_5", "--batch-sizes", "4,4"], "lists a size twice"),
    (["tiny:qwen3_5", "--variants", "stock,fast"], "--variants: unknown 'fast'"),
    (["tiny:qwen3_5", "--plot", "{tmp}/no/such/dir/p.png"], "does not exist"),
    (["tiny:qwen3_5", "--plot", "{tmp}"], "give a path ending in .png"),
    (["tiny:qwen3_5", "--plot", "{tmp}/p.svg"], "writes a PNG file"),
    (["tiny:qwen3_5", "--plot", "{tmp}/dir.png"], "is a directory"),
    (["tiny:qwen3_5", "--json", "{tmp}/no/such/dir/r.json"], "does not exist"),
]


def test_bad_options_are_one_line_errors_before_torch_is_imported(tmp_path):
    """Each bad option: exit 2, one error line, no traceback, nothing written, torch never imported."""
    (tmp_path / "dir.png").mkdir()
    cases = [[a.replace("{tmp}", str(tmp_path)) for a in args] for args, _ in BAD]
    script = (
        "import contextlib, io, json, sys\n"
        "from replayssm.cli.main import main\n"
        "out = []\n"
        "for args in json.loads(sys.argv[1]):\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):\n"
        "        code = main(['bench', *args])\n"
        "    out.append([code, err.getvalue()])\n"
        "print(json.dumps({'results': out, 'torch': 'torch' in sys.modules,\n"
        "                  'transformers': 'transformers' in sys.modules}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(cases)], capture_output=True, text=True,
                          timeout=120, env={**__import__("os").environ, "COLUMNS": "200", "NO_COLOR": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    for (args, message), (code, err) in zip(BAD, got["results"]):
        assert code == 2, (args, err)
        error, _ = one_error(err)
        assert message in error, (args, error)
    assert got["torch"] is False and got["transformers"] is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.png"]


def test_preset_without_cuda_needs_an_explicit_cpu_device(capsys):
    from replayssm.cli.main import main

    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the preset would run")
    assert main(["bench", "--preset", "qwen3.5-4b-like"]) == 2
    error, hint = one_error(capsys.readouterr().err)
    assert "no CUDA device" in error and "--device cpu" in hint


def test_help_has_examples():
    from typer.testing import CliRunner

    from replayssm.cli.main import app

    result = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    for word in ("--preset", "--batch-sizes", "--plot", "--smoke", "replayssm bench --preset", "Exit codes"):
        assert word in result.output, word
    dtype_line = next(line for line in result.output.splitlines() if "--dtype " in line)
    assert "[fp32|bf16|fp16]" in dtype_line  # the weights' dtypes only: 8-bit is a checkpoint's (--state-dtype)


# --------------------------------------------------------------------------- the library
def test_step_time_is_the_difference_of_two_lengths(monkeypatch):
    """ms/step = (t(N) - t(n0)) / (N - n0), median over repeats, after one warm-up of every length."""
    from replayssm import bench

    calls = []
    # extra seconds per call, per round (prefill, n0, N): the rounds differ, so the median matters
    extra = iter([0.0, 0.0, 0.0] + [0.004, 0.0, 0.001] + [0.0, 0.0, 0.0] + [0.010, 0.0, 0.032])

    def fake(model, ids, mask, new_tokens, pad, eos, cuda):
        assert eos == 100  # the vocabulary's width: no token takes it
        calls.append(new_tokens)
        return 0.100 + 0.002 * new_tokens + next(extra)

    monkeypatch.setattr(bench, "_timed_generate", fake)
    settings = bench.BenchSettings(batch_sizes=(4,), new_tokens=40, repeats=3, dtype="fp32", device="cpu")
    row = bench.BenchRow(4, "stock")
    no_head = types.SimpleNamespace(get_output_embeddings=lambda: None)
    bench._measure(no_head, row, settings, vocab=100, pad=0, special={0}, device=torch.device("cpu"))
    assert calls == [1, 8, 40] + [1, 8, 40] * 3
    assert row.step_ms_samples == pytest.approx([2.0 + 1 / 32, 2.0, 3.0])
    assert row.ms_per_step == pytest.approx(2.0 + 1 / 32)
    assert row.tokens_per_s == pytest.approx(4 / (row.ms_per_step / 1e3))
    assert row.prefill_ms == pytest.approx(106.0)  # 0.102 s plus the noise of the middle round


def test_generate_runs_every_step_even_when_the_row_emits_eos(monkeypatch):
    """The timed calls end sequences at an id no token takes: a row whose greedy token is the model's EOS
    keeps generating, and no minimum-length logits processor runs (it is not decode-step work)."""
    import transformers.generation.logits_process as processors

    from replayssm import bench
    from replayssm.tiny import build_tiny_model

    model = build_tiny_model("tiny:mamba2")
    ids = torch.randint(3, 500, (1, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    first = model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0)
    model.generation_config.eos_token_id = int(first[0, 6])  # the first token the row emits
    stopped = model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert stopped.shape[1] == 7  # with the model's EOS the row stops after one token
    eos = bench.unreachable_token(model, model.config.vocab_size)
    assert eos >= model.get_output_embeddings().weight.shape[0]

    def refuse(self, input_ids, scores):
        raise AssertionError(f"{type(self).__name__} ran")

    for name in ("MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor"):
        monkeypatch.setattr(getattr(processors, name), "__call__", refuse)
    assert bench._timed_generate(model, ids, mask, 5, 0, eos, False) > 0  # raises unless 5 new tokens came back


def test_out_of_memory_becomes_a_row_and_the_model_is_given_back(monkeypatch):
    """A batch that runs out of memory is an error row; larger batches of that variant are skipped, the
    other variants still run, and the model comes back patched as it came, with its configuration."""
    import replayssm
    from replayssm import bench
    from replayssm.tiny import build_tiny_model

    model = build_tiny_model("tiny:qwen3_5")
    replayssm.patch(model, buffer_len=8, state_dtype="bf16")
    block = json.dumps(model.config.replayssm, sort_keys=True)
    seen = []

    def measure(net, row, settings, *args):
        seen.append((row.variant, row.batch_size, replayssm.is_patched(net),
                     net.config.replayssm["buffer_len"] if replayssm.is_patched(net) else None))
        if row.variant == "eager" and row.batch_size == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB.")
        row.ms_per_step, row.tokens_per_s, row.prefill_ms = 2.0 / row.batch_size, 1.0, 1.0

    monkeypatch.setattr(bench, "_measure", measure)
    settings = bench.BenchSettings(batch_sizes=(1, 2, 3), variants=("stock", "eager", "graphs"), buffer_len=4,
                                   device="cpu", dtype="fp32")
    result = bench.run_bench(model, settings)
    assert seen == [("stock", 1, False, None), ("stock", 2, False, None), ("stock", 3, False, None),
                    ("eager", 1, True, 4), ("eager", 2, True, 4)]
    rows = {(r.batch_size, r.variant): r for r in result.rows}
    assert (rows[2, "eager"].status, rows[2, "eager"].note) == ("error", "out of memory")
    assert (rows[3, "eager"].status, rows[3, "eager"].note) == ("error", "skipped: batch 2 ran out of memory")
    assert rows[1, "eager"].speedup_vs_stock == pytest.approx(1.0) and rows[1, "eager"].status == "ok"
    assert all(rows[b, "graphs"].status == "n/a" for b in (1, 2, 3))
    assert result.to_dict()["ok"] is False and len(result.failed) == 2
    assert replayssm.is_patched(model) and json.dumps(model.config.replayssm, sort_keys=True) == block


def test_a_converted_checkpoint_keeps_its_layer_selection(tmp_path, monkeypatch, tiny_cache):
    """MODEL as a converted directory: loaded stock, each patched variant rewrites only the layers its
    replayssm block names, with the benchmark's buffer_len, and the block is back on the config after."""
    import replayssm
    from replayssm import bench
    from replayssm.api import replayssm_report

    out = tmp_path / "converted"
    replayssm.convert("tiny:bamba", out, layers=["model.layers.0.mamba"], validate=False)
    settings = bench.BenchSettings(batch_sizes=(1,), variants=("stock", "eager"), buffer_len=3, device="cpu",
                                   dtype="fp32")
    model, info = bench.load_model(model=str(out), preset=None, settings=settings)
    assert info["source"]["kind"] == "directory" and not replayssm.is_patched(model)
    block = json.dumps(model.config.replayssm, sort_keys=True)
    seen = []

    def measure(net, row, *args):
        report = replayssm_report(net)
        seen.append((row.variant, [r.name for r in report.get("rewritten", [])],
                     report["config"].buffer_len if report else None))
        row.ms_per_step, row.tokens_per_s, row.prefill_ms = 1.0, 1.0, 1.0

    monkeypatch.setattr(bench, "_measure", measure)
    bench.run_bench(model, settings, model_info=info)
    assert seen == [("stock", [], None), ("eager", ["model.layers.0.mamba"], 3)]
    assert not replayssm.is_patched(model) and json.dumps(model.config.replayssm, sort_keys=True) == block


def test_graph_variants_are_unavailable_without_cuda_or_without_the_option():
    import inspect

    import replayssm
    from replayssm import bench

    assert bench.unavailable_reason("graphs", torch.device("cpu")) == "n/a: needs CUDA"
    assert bench.unavailable_reason("eager", torch.device("cpu")) is None
    has_option = "cuda_graphs" in inspect.signature(replayssm.patch).parameters
    reason = bench.unavailable_reason("graphs-per-step", torch.device("cuda"))
    assert (reason is None) if has_option else reason.startswith("n/a: this replayssm has no CUDA-graph decoding")


def test_a_model_without_ssm_layers_is_refused_before_timing(monkeypatch):
    from replayssm import bench
    from replayssm.errors import UnsupportedLayerError
    from replayssm.tiny import build_tiny_model

    monkeypatch.setattr(bench, "_measure", lambda *a: pytest.fail("timed a model that cannot be patched"))
    with pytest.raises(UnsupportedLayerError):
        bench.run_bench(build_tiny_model("tiny:mamba"), bench.BenchSettings(device="cpu", dtype="fp32"))


@pytest.mark.parametrize("name, kind, count, shapes, others, params", [
    ("nemotron3-nano-like", "mamba2", 12, {"num_heads": 96, "head_dim": 80, "state_size": 128, "n_groups": 8},
     {"full_attention": 2, "mlp": 14}, (2.0e9, 2.6e9)),
    ("qwen3.5-4b-like", "gated_deltanet", 24,
     {"num_k_heads": 16, "num_v_heads": 32, "head_k_dim": 128, "head_v_dim": 128}, {"full_attention": 8},
     (3.6e9, 4.4e9)),
    ("kimi-linear-like", "kda", 21, {"num_heads": 32, "head_dim": 128}, {"full_attention": 6}, (2.5e9, 4.5e9)),
])
def test_presets_have_the_real_layer_sizes(name, kind, count, shapes, others, params):
    """Built on the meta device: the SSM layers, the other layer types and the parameter count."""
    from replayssm.discovery import find_ssm_layers
    from replayssm.presets import build_preset

    model = build_preset(name, torch.bfloat16, "meta")
    records = find_ssm_layers(model)
    assert len(records) == count and all(r.kind == kind and r.can_rewrite for r in records)
    assert all(r.shapes == shapes for r in records)
    config = model.config
    types = list(getattr(config, "layers_block_type", None) or config.layer_types)
    for layer_type, n in others.items():
        assert types.count(layer_type) == n, types
    assert params[0] < sum(p.numel() for p in model.parameters()) < params[1]


# --------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5", "kimi_linear"])
def test_bench_on_cuda_times_every_variant(family, tmp_path, capsys):
    """On CUDA every variant is timed (or, without CUDA-graph support in patch(), reported as such),
    with peak memory, and the graph variants report their capture."""
    import inspect

    import replayssm
    from replayssm.cli.main import main

    code = main(["bench", f"tiny:{family}", "--device", "cuda", "--dtype", "fp32", "--batch-sizes", "1,4",
                 "--new-tokens", "20", "--repeats", "2", "--json", str(tmp_path / "r.json")])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["gpu"] and data["device"].startswith("cuda")
    graphs = "cuda_graphs" in inspect.signature(replayssm.patch).parameters
    for r in data["rows"]:
        if r["variant"] in ("graphs", "graphs-per-step") and not graphs:
            assert r["status"] == "n/a", r
            continue
        assert r["status"] == "ok", r
        assert r["ms_per_step"] > 0 and r["peak_memory_bytes"] > 0
        if r["variant"] in ("graphs", "graphs-per-step"):
            assert r["graphs"] and r["capture_s"] > 0 and r["graph_memory_bytes"] >= 0, r
