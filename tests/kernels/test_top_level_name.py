"""The repository's ``kernels/`` folder is ``replayssm.kernels``; from the repository root (where
``python -m pytest`` and pytest-xdist put it on sys.path) it must not stand in for the ``kernels``
distribution that transformers 5.25 imports."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run_from_root(code: str, extra_path: str | None = None) -> list[str]:
    env = {"PATH": "/usr/bin:/bin", **({"PYTHONPATH": extra_path} if extra_path else {})}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_an_installed_kernels_distribution_wins_over_the_folder(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("MARK = 'hub'\nfrom .layer import NAME\n")
    (tmp_path / "kernels" / "layer.py").write_text("NAME = 'layer'\n")
    mark, path, name, backend = _run_from_root(
        "import kernels, replayssm.kernels.backend as b; print(kernels.MARK, kernels.__file__, kernels.NAME, "
        "b.__name__)", str(tmp_path))
    assert (mark, path, name) == ("hub", str(tmp_path / "kernels" / "__init__.py"), "layer")
    assert backend == "replayssm.kernels.backend"


def test_without_one_the_folder_imports_as_an_empty_module():
    """No other ``kernels`` on the path (site-packages left out, where one may be installed): the
    folder's module, without a version, which transformers takes as the distribution missing."""
    mark, path, version = _run_from_root(
        "import sys; sys.path = [p for p in sys.path if 'site-packages' not in p]; import kernels; "
        "print(getattr(kernels, 'MARK', None), kernels.__file__, getattr(kernels, '__version__', None))")
    assert (mark, path, version) == ("None", str(ROOT / "kernels" / "__init__.py"), "None")
