"""The `dsx` command: registers the commands and maps every failure to one line + exit code.

Exit codes: 0 ok, 1 failure, 2 usage (bad options, not implemented), 130 interrupted (Ctrl-C), 143 stopped by SIGTERM
(handled as Ctrl-C).
DSX_DEBUG=1 shows the traceback of any failure.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback

import typer

from ds_export import __version__
from ds_export.cli import (cmd_download, cmd_export, cmd_generate, cmd_inspect, cmd_quantize, cmd_run, cmd_tiny,
                           cmd_verify)
from ds_export.errors import DsxError
from ds_export.interrupt import handle_stop_signals, stop_requested, terminated

app = typer.Typer(
    name="dsx",
    help="dsx: quantize and export DeepSeek-V3/R1 for Paddle's LLM serving stack.\n\n"
         "Set DSX_DEBUG=1 to see tracebacks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

for fn in (cmd_download.download, cmd_quantize.quantize, cmd_export.export, cmd_verify.verify,
           cmd_generate.generate, cmd_run.run, cmd_inspect.inspect, cmd_tiny.tiny):
    # (the command list shows the docstring's first paragraph: as one line, not broken where the source wraps it)
    app.command(name=fn.__name__, short_help=" ".join((fn.__doc__ or "").split("\n\n")[0].split()))(fn)


def _version(value: bool) -> None:
    if value:
        print(f"dsx {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    pass


_INTERRUPTED = "interrupted; partial outputs were left unpublished (rerun to resume)"


def _fail(msg: str, code: int) -> int:
    if os.environ.get("DSX_DEBUG"):
        traceback.print_exc()
    sys.stderr.write(f"dsx: error: {msg}\n")
    return code


def main(argv: list[str] | None = None) -> int:
    """Entry point. Returns (and, as a console script, exits with) the exit code."""
    args = sys.argv[1:] if argv is None else argv
    from ds_export.export.quiet import quiet_paddle

    quiet_paddle()  # (whichever command imports paddle: export, generate, verify's end-to-end check, run)
    if argv is None:  # (the dsx process itself, not a caller's: SIGTERM stops the command as Ctrl-C does)
        handle_stop_signals()
    try:
        rv = app(args=args, prog_name="dsx", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
        if code == 130:  # Ctrl-C inside a command: Typer turns it into Exit(130), which click returns as the value
            code = _fail(_INTERRUPTED, 130)
    except DsxError as e:
        code = _fail(e.one_line(), e.exit_code)
    except typer.Exit as e:  # Typer reports Ctrl-C as Exit(130) without a word
        code = _fail(_INTERRUPTED, 130) if e.exit_code == 130 else e.exit_code
    except (KeyboardInterrupt, typer.Abort):
        code = _fail(_INTERRUPTED, 130)
    except BrokenPipeError:
        code = 1
    except OSError as e:
        hint = _OS_HINTS.get(e.errno)
        if hint and e.errno in (errno.ENOSPC, errno.EDQUOT) and _command(args) in _RESUMABLE:
            hint += "; rerunning resumes"
        code = _fail(f"{e.strerror or e}: {e.filename or ''}".rstrip(": ") + (f" ({hint})" if hint else ""), 1)
    except Exception as e:  # noqa: BLE001 - the one place every unexpected failure becomes one line
        if stop_requested():  # (Ctrl-C or SIGTERM raised inside a C extension, which turned it into this)
            return _finish(argv, _fail(_INTERRUPTED, 130))
        if _is_usage_error(e):
            ctx = getattr(e, "ctx", None)
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            return _finish(argv, _fail(e.format_message().replace("\n", " ") + hint, 2))
        if isinstance(e, RuntimeError) and str(e).startswith("Symlink loop from "):  # (pathlib before 3.13: ELOOP)
            return _finish(argv, _fail(f"{str(e)[len('Symlink loop from '):].strip(chr(39))}: a symbolic link that "
                                       "points back at itself (check the path: replace the link)", 1))
        code = _fail(f"internal error: {e.__class__.__name__}: {e} (set DSX_DEBUG=1 for the traceback, "
                     "and please report it)", 1)
    return _finish(argv, code)


# What to do about the system errors a command meets on its paths (the message names the path already).
_OS_HINTS = {
    errno.ENOSPC: "the disk is full: free space or choose another --out",
    errno.EDQUOT: "the disk quota is used up: free space or choose another --out",
    errno.EACCES: "no permission: choose a path you can write, or fix its permissions",
    errno.EPERM: "not permitted: choose a path you can write, or fix its permissions",
    errno.EROFS: "a read-only file system: choose another --out",
    errno.ENOENT: "check the path: a directory on the way does not exist",
    errno.ENOTDIR: "check the path: a part of it is a file, not a directory",
    errno.EIO: "the disk reported an I/O error: check it (dmesg), then rerun",
}


# The commands that pick up where they stopped (their finished files are kept and checked); the others start over.
_RESUMABLE = {"download", "quantize", "run"}


def _command(args: list[str]) -> str:
    return next((a for a in args if not a.startswith("-")), "")


def _is_usage_error(e: Exception) -> bool:
    """Typer's bad-option errors (its parser's exception classes are not public: match their interface)."""
    return callable(getattr(e, "format_message", None)) and getattr(e, "exit_code", None) == 2


def _finish(argv: list[str] | None, code: int) -> int:
    if code == 130 and terminated():  # (stopped by SIGTERM: 128 + 15, as a shell reports it)
        code = 143
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
