"""pytest plugin: transformers' own model test suites with every model they build patched by replayssm.

Loaded with ``-p replayssm_plugin`` (``scripts/transformers_suite.sh`` puts this directory on
``PYTHONPATH``). ``REPLAYSSM_SUITE=patched`` (the default) patches every model the tests build,
``REPLAYSSM_SUITE=stock`` only records, so that both runs go through the same machinery:

* a model is patched when its outermost ``__init__`` finishes (``PreTrainedModel.post_init`` of a
  model not being built inside another one: ``XForCausalLM`` is patched, not its inner ``XModel``
  separately), which covers ``model_class(config)``, ``from_config`` and ``from_pretrained``;
* options: ``buffer_len`` from ``REPLAYSSM_SUITE_BUFFER_LEN`` (default 3, so that a few decode
  steps flush), ``strict=False``; models without a rewritable SSM layer stay as they are;
* every test records how many replay decode steps ran and how many of them flushed a row
  (``replay_steps`` / ``replay_flushes`` in the JUnit XML properties, totals in the summary).

The hook is installed at ``pytest_configure`` and removed at ``pytest_unconfigure``: it is test
infrastructure for this comparison only, never part of the package.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

MODE = os.environ.get("REPLAYSSM_SUITE", "patched")
BUFFER_LEN = int(os.environ.get("REPLAYSSM_SUITE_BUFFER_LEN", "3"))

_state = {"steps": 0, "flushes": 0, "built": 0, "patched": 0}
_totals = {"tests": 0, "patched_tests": 0, "replay_tests": 0, "flush_tests": 0}
_restore: list = []


def _built_inside_another(model) -> bool:
    """Whether ``model.post_init`` runs inside the ``__init__`` of another PreTrainedModel."""
    from transformers import PreTrainedModel

    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "__init__":
            owner = frame.f_locals.get("self")
            if owner is not model and isinstance(owner, PreTrainedModel):
                return True
        frame = frame.f_back
    return False


def _patch(model) -> None:
    import replayssm
    from replayssm.errors import NoSSMLayersError, UnsupportedLayerError

    _state["built"] += 1
    if MODE != "patched":
        return
    try:
        replayssm.patch(model, buffer_len=BUFFER_LEN, strict=False)
    except (NoSSMLayersError, UnsupportedLayerError):
        return  # e.g. a vision tower or a model of the family without SSM layers
    _state["patched"] += 1


def _install() -> None:
    from transformers import PreTrainedModel

    from replayssm.patches.cache_state import get_buffers
    from replayssm.patches.registry import replay_mixins

    post_init = PreTrainedModel.post_init

    def patched_post_init(self, *args, **kwargs):
        result = post_init(self, *args, **kwargs)
        if not _built_inside_another(self):
            _patch(self)
        return result

    def counted(replay_step):
        def counted_replay_step(self, hidden_states, layer, buffers, attention_mask):
            out = replay_step(self, hidden_states, layer, buffers, attention_mask)
            if torch.compiler.is_compiling():  # a compiled decode step: count nothing, break nothing
                return out
            _state["steps"] += 1
            if bool((get_buffers(layer).cursor == 0).any()):  # advanced from L-1: that row flushed
                _state["flushes"] += 1
            return out
        return counted_replay_step

    PreTrainedModel.post_init = patched_post_init
    _restore.append((PreTrainedModel, "post_init", post_init))
    for mixin in replay_mixins().values():
        _restore.append((mixin, "_replay_step", mixin.__dict__["_replay_step"]))
        mixin._replay_step = counted(mixin.__dict__["_replay_step"])


def pytest_configure(config):
    if MODE not in ("patched", "stock"):
        raise pytest.UsageError(f"REPLAYSSM_SUITE must be 'patched' or 'stock', found {MODE!r}")
    _install()


def pytest_unconfigure(config):
    while _restore:
        owner, name, value = _restore.pop()
        setattr(owner, name, value)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    for key in _state:
        _state[key] = 0
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when != "teardown":
        return
    props = {"replayssm_mode": MODE, "models_built": _state["built"], "models_patched": _state["patched"],
             "replay_steps": _state["steps"], "replay_flushes": _state["flushes"]}
    outcome.get_result().user_properties.extend(props.items())  # the JUnit XML reads the report's
    _totals["tests"] += 1
    _totals["patched_tests"] += bool(_state["patched"])
    _totals["replay_tests"] += bool(_state["steps"])
    _totals["flush_tests"] += bool(_state["flushes"])


def pytest_terminal_summary(terminalreporter):
    t = _totals
    terminalreporter.write_sep("-", f"replayssm ({MODE}, buffer_len={BUFFER_LEN})")
    terminalreporter.write_line(
        f"{t['tests']} tests; {t['patched_tests']} built a patched model; {t['replay_tests']} ran the replay "
        f"decode path; {t['flush_tests']} flushed a ring")
