"""The ``replayssm`` app: commands, global options, error handling and exit codes.

``run()`` is the console-script entry point. It parses with the typer app in
non-standalone mode so that every failure is reported the same way: one red
``error: ...`` line plus a ``hint: ...`` line on stderr (with ``--json``, also one JSON
error object on stdout), no traceback unless ``--debug`` or ``REPLAYSSM_DEBUG=1`` (and
then without local variables), and a documented exit code.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import NoReturn, Sequence

import typer

from .cmd_bench import bench_command
from .cmd_convert import convert_command
from .cmd_env import env_command
from .cmd_inspect import inspect_command
from .common import err, print_json, quiet_environment

EXIT_OK = 0
EXIT_FAILED = 1  # validation failed, or an unexpected internal error
EXIT_USAGE = 2  # invalid arguments or options, unusable input, refused output
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT)
EXIT_TERMINATED = 143  # SIGTERM
DEBUG_ENV = "REPLAYSSM_DEBUG"

EXIT_CODES_HELP = (
    "[bold]Exit codes[/bold]: 0 success · 1 validation failed or internal error · "
    "2 invalid usage, input or output (missing/corrupt checkpoint, no SSM layers, unsupported layer, "
    "existing OUT_DIR, out of disk, unwritable REPLAYSSM_CACHE) · 130 interrupted (Ctrl-C) · "
    "143 terminated (SIGTERM). "
    "Errors print one line and a hint; --debug or REPLAYSSM_DEBUG=1 adds the traceback."
)

app = typer.Typer(
    name="replayssm",
    help=(
        "Rewrite the SSM layers (Mamba-2, Gated DeltaNet, KDA) of Hugging Face hybrid models into "
        "ReplaySSM layers.\n\n"
        "[bold]Examples[/bold]\n\n"
        "  replayssm inspect tiny:nemotron_h\n\n"
        "  replayssm convert ./Nemotron-H-8B out/nemotron-replay --device cuda\n\n"
        "  replayssm env"
    ),
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("replayssm")
    except Exception:  # noqa: BLE001 - not installed as a distribution: ask the package
        from replayssm import __version__

        return __version__


def _version_callback(value: bool) -> None:
    if value:
        sys.stdout.write(f"replayssm {_version()}\n")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", "-V", is_eager=True, callback=_version_callback,
                                 help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors (also REPLAYSSM_DEBUG=1); "
                                                      "accepted anywhere on the command line."),
) -> None:
    """Global options."""


app.command("inspect", epilog=EXIT_CODES_HELP)(inspect_command)
app.command("convert", epilog=EXIT_CODES_HELP)(convert_command)
app.command("env", epilog=EXIT_CODES_HELP)(env_command)
app.command("bench", epilog=EXIT_CODES_HELP)(bench_command)


# --------------------------------------------------------------------------- error reporting
def _click_classes(name: str) -> tuple[type, ...]:
    """Exception class ``name`` from click and from the copy of click that newer typers vendor."""
    import importlib

    found: list[type] = []
    for module in ("typer._click.exceptions", "typer.exceptions", "click.exceptions"):
        try:
            cls = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if isinstance(cls, type) and cls not in found:
            found.append(cls)
    return tuple(found)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _report(message: str, hint: str | None, *, json_mode: bool, code: int, kind: str, extra: dict | None = None):
    line = typer.style("error: ", fg="red", bold=True) if err.is_terminal else "error: "
    sys.stderr.write(line + _one_line(message) + "\n")
    if hint:
        prefix = typer.style("hint: ", fg="yellow") if err.is_terminal else "hint: "
        sys.stderr.write(prefix + _one_line(hint) + "\n")
    sys.stderr.flush()
    if json_mode:
        error = {"type": kind, "message": _one_line(message), "hint": _one_line(hint) if hint else None}
        print_json({"ok": False, "exit_code": code, "error": error, **(extra or {})})


def _traceback() -> None:
    from rich.console import Console

    Console(stderr=True).print_exception(show_locals=False)


def _command_name(argv: Sequence[str]) -> str | None:
    for arg in argv:
        if arg in ("inspect", "convert", "env", "bench"):
            return arg
    return None


def main(argv: Sequence[str], *, debug: bool = False) -> int:
    """Run the CLI on ``argv`` (without the program name); return the exit code."""
    json_mode = "--json" in argv
    command = typer.main.get_command(app)
    interrupted = ("interrupted; nothing was written" if _command_name(argv) == "convert" else "interrupted")
    try:
        rv = command.main(args=list(argv), prog_name="replayssm", standalone_mode=False)
        code = rv if isinstance(rv, int) else EXIT_OK
    except _click_classes("NoArgsIsHelpError") as exc:
        text = exc.format_message()  # typer's rich help printed itself while the error was made
        if text.strip():
            sys.stdout.write(text + "\n")
        return EXIT_OK
    except _click_classes("Exit") as exc:
        code = exc.exit_code
    except _click_classes("UsageError") as exc:
        name = exc.ctx.command_path if exc.ctx is not None else "replayssm"
        _report(exc.format_message(), f"see '{name} --help' for the options and examples",
                json_mode=json_mode, code=EXIT_USAGE, kind="UsageError")
        return EXIT_USAGE
    except _click_classes("Abort"):
        _report(interrupted, None, json_mode=json_mode, code=EXIT_INTERRUPTED, kind="Interrupted")
        return EXIT_INTERRUPTED
    except _click_classes("ClickException") as exc:
        _report(exc.format_message(), None, json_mode=json_mode, code=EXIT_USAGE, kind=type(exc).__name__)
        return EXIT_USAGE
    except Terminated as exc:
        _report(interrupted.replace("interrupted", "terminated"), None, json_mode=json_mode, code=exc.exit_code,
                kind="Terminated")
        return exc.exit_code
    except KeyboardInterrupt:
        if debug:
            _traceback()
        _report(interrupted, None, json_mode=json_mode, code=EXIT_INTERRUPTED, kind="Interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - the one place that turns exceptions into exit codes
        from replayssm.errors import ReplaySSMError, ValidationFailedError

        if debug:
            _traceback()
        if isinstance(exc, ReplaySSMError):
            code = EXIT_FAILED if isinstance(exc, ValidationFailedError) else EXIT_USAGE
            extra = None
            validation = getattr(exc, "validation", None)
            if isinstance(exc, ValidationFailedError) and validation is not None:
                from .render import check_line

                if not json_mode:
                    for check in validation.checks:
                        err.print(check_line(check.ok, check.detail))
                extra = {"validation": validation.to_dict()}
            _report(str(exc), exc.hint, json_mode=json_mode, code=code, kind=type(exc).__name__, extra=extra)
            return code
        text = str(exc).strip().splitlines()
        message = f"unexpected {type(exc).__name__}" + (f": {text[0]}" if text else "")
        hint = None if debug else f"rerun with --debug (or {DEBUG_ENV}=1) for the traceback, and report it"
        cmd = _command_name(argv)
        if cmd == "convert":
            message += "; nothing was written"
        _report(message, hint, json_mode=json_mode, code=EXIT_FAILED, kind=type(exc).__name__)
        return EXIT_FAILED
    if code == EXIT_INTERRUPTED:  # typer turns KeyboardInterrupt into Exit(130)
        _report(interrupted, None, json_mode=json_mode, code=EXIT_INTERRUPTED, kind="Interrupted")
    return code


class Terminated(BaseException):
    """Raised in the main thread on SIGTERM; unwinds like Ctrl-C, removing temporary output."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.exit_code = 128 + signum


def _on_sigterm(signum, frame) -> None:  # noqa: ARG001
    raise Terminated(signum)


def run(argv: Sequence[str] | None = None) -> NoReturn:
    """Console-script entry point: ``replayssm ...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")
    if "--" in args:
        cut = args.index("--")
        head, tail = args[:cut], args[cut:]
    else:
        head, tail = args, []
    if "--debug" in head:
        debug = True
        head = [a for a in head if a != "--debug"]
    args = head + tail
    quiet_environment()
    for stream in (sys.stdout, sys.stderr):  # a non-UTF-8 terminal gets "?" for ✓, not a crash
        try:
            stream.reconfigure(errors="replace")
        except (AttributeError, ValueError):
            pass
    if not debug:
        import warnings

        warnings.filterwarnings("ignore")
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # not the main thread
        pass
    sys.exit(main(args, debug=debug))


__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_TERMINATED", "EXIT_USAGE", "app", "main", "run"]
