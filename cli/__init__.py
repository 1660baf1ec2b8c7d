"""The ``replayssm`` command line: ``inspect``, ``convert`` and ``env`` (typer + rich).

Entry point: ``replayssm.cli.main:run`` (the ``replayssm`` console script), or
``python -m replayssm.cli``. Modules: ``main`` (app, error handling, exit codes),
``cmd_inspect`` / ``cmd_convert`` / ``cmd_env`` (one command each), ``render`` (rich
tables and lines), ``progress`` (rich progress bars), ``common`` (consoles, enums, JSON).
"""
