#!/usr/bin/env bash
# transformers' own model test suites, stock and with every model they build patched by replayssm
# (buffer_len=3, strict=False), and a per-family table of the two runs. Fetches nothing.
#
#   bash scripts/transformers_suite.sh TRANSFORMERS_TESTS_DIR [family ...]
#
# TRANSFORMERS_TESTS_DIR: the tests/ directory of a transformers source tree of the installed version
# (e.g. a checkout of the v5.24.0 tag); its models/<family>/test_modeling_<family>.py are run, from its
# parent directory (so a conftest.py there applies; tests/transformers_suite/RESULTS.md says how its runs
# assembled such a tree where no checkout could be had).
# Families default to every one replayssm rewrites. Environment:
#   REPLAYSSM_SUITE_K    pytest -k selection (default: the generation, attention-output, inputs-embeds,
#                        base-model-prefix and mismatched-shapes tests; "" runs whole files)
#   REPLAYSSM_SUITE_OUT  results directory (default transformers-suite-results): JUnit XML and logs per
#                        family and mode, and RESULTS.md, the table
#   REPLAYSSM_SUITE_BUFFER_LEN  (default 3)
set -uo pipefail
if [ $# -lt 1 ] || [ ! -d "$1/models" ]; then
    echo "usage: $0 TRANSFORMERS_TESTS_DIR [family ...]  (a transformers source tree's tests/, with models/)" >&2
    exit 2
fi
HERE="$(cd "$(dirname "$0")/.." && pwd)"
TESTS="$(cd "$1" && pwd)"
ROOT="$(dirname "$TESTS")"  # transformers' tests import each other as the package `tests`
shift
FAMILIES=("$@")
if [ ${#FAMILIES[@]} -eq 0 ]; then
    FAMILIES=(mamba2 nemotron_h bamba falcon_h1 zamba2 granitemoehybrid qwen3_next qwen3_5 qwen3_5_moe qwen4_exp
              olmo_hybrid kimi_linear bailing_hybrid glm5_next)
fi
K="${REPLAYSSM_SUITE_K-generate or attention_outputs or inputs_embeds or base_model_prefix or mismatched}"
OUT="$(mkdir -p "${REPLAYSSM_SUITE_OUT:-transformers-suite-results}" && cd "${REPLAYSSM_SUITE_OUT:-transformers-suite-results}" && pwd)"
# transformers' loading tests assert on its logged warnings ("Reinit due to size mismatch"): keep them on
unset TRANSFORMERS_VERBOSITY
export HF_HUB_OFFLINE=1 PYTHONPATH="$HERE/tests/transformers_suite:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
for family in "${FAMILIES[@]}"; do
    file="tests/models/$family/test_modeling_$family.py"
    if [ ! -f "$ROOT/$file" ]; then
        echo "$family: no $file in $ROOT, skipped" >&2
        continue
    fi
    for mode in stock patched; do
        echo "== $family ($mode)"
        (cd "$ROOT" && REPLAYSSM_SUITE=$mode python -m pytest -p replayssm_plugin -p no:cacheprovider -q -o addopts="" \
            ${K:+-k "$K"} --junitxml="$OUT/$family-$mode.xml" "$file") >"$OUT/$family-$mode.log" 2>&1
        tail -n 3 "$OUT/$family-$mode.log"
    done
done
python "$HERE/tests/transformers_suite/table.py" "$OUT" | tee "$OUT/RESULTS.md"
