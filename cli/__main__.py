"""``python -m replayssm.cli`` = the ``replayssm`` console script."""

from .main import run

if __name__ == "__main__":
    run()
