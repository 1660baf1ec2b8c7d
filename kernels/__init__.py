"""ReplaySSM kernels: torch + triton only (never imports transformers).

Every kernel has a plain PyTorch reference with the same signature; the
reference is also the CPU path. ``replayssm.kernels.backend`` picks one.
"""

if __name__ == "kernels":
    # Imported as a top-level ``kernels``: the repository root is on sys.path (``python -m`` or
    # pytest-xdist started in a checkout), and this folder shadows the ``kernels`` distribution that
    # transformers imports (a dependency from transformers 5.25). Load that one in this module's place
    # where it is installed; else stay an empty module without a version, which transformers' check
    # for that distribution takes as not installed. The package itself is only ``replayssm.kernels``.
    import importlib.machinery
    import importlib.util
    import os
    import sys

    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _spec = importlib.machinery.PathFinder.find_spec(
        "kernels", [p for p in sys.path if os.path.abspath(p or os.curdir) != _root])
    if _spec is not None and _spec.loader is not None:
        _module = importlib.util.module_from_spec(_spec)
        sys.modules["kernels"] = _module  # what the import statement returns once this file has run
        _spec.loader.exec_module(_module)
