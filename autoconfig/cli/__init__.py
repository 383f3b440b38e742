"""The ``autoconfig`` command line: thin click commands over the library.

Each command lives in its own module; library errors become one-line messages
here and nowhere else.
"""

import errno
import sys

import click

from autoconfig import __version__
from autoconfig.errors import AutoconfigError, ProfilingError, shortened
from autoconfig.signals import Terminated, stop_cleanly

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="autoconfig")
def cli() -> None:
    """Find the model size, hyper-parameters and parallel layout that train
    fastest on your cluster: predicted in seconds, then proven by profiling."""


def _register() -> None:
    # Imported here, after ``cli`` exists, so each command module stays independent.
    from autoconfig.cli import (base_cmd, calibrate_cmd, capacity_cmd, catalog_cmd,
                                estimate_cmd, infer_cmd, report_cmd, search_cmd, sweep_cmd,
                                validate_cmd)
    for command in (catalog_cmd.catalog, base_cmd.base, search_cmd.search,
                    estimate_cmd.estimate, capacity_cmd.capacity, validate_cmd.validate,
                    report_cmd.report, calibrate_cmd.calibrate, infer_cmd.infer,
                    infer_cmd.infer_validate, sweep_cmd.sweep, sweep_cmd.compare):
        cli.add_command(command)


_register()


def main(argv: list[str] | None = None) -> None:
    """Entry point: one-line errors with exit status 2, never a traceback."""
    try:
        with stop_cleanly():
            code = cli.main(args=argv, prog_name="autoconfig", standalone_mode=False)
    except ProfilingError as exc:
        click.echo(f"error: {shortened(str(exc))}", err=True)
        sys.exit(EXIT_FAILED)
    except AutoconfigError as exc:
        click.echo(f"error: {shortened(str(exc))}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        sys.exit(EXIT_BAD_INPUT)
    except click.ClickException as exc:
        # one line: click lists choices on lines of their own
        click.echo(f"error: {shortened(' '.join(exc.format_message().split()))}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except click.exceptions.Abort as exc:
        # click turns a KeyboardInterrupt (Ctrl-C, or SIGTERM/SIGHUP: Terminated) into Abort
        _stopped(exc.__cause__ or exc.__context__)
    except KeyboardInterrupt as exc:
        _stopped(exc)
    except OSError as exc:
        # The environment, not the input: a full disk, a read-only or missing
        # folder, a name the file system refuses. One line naming the file.
        click.echo(f"error: {shortened(environment_fault(exc))}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    sys.exit(code if isinstance(code, int) else 0)


def _stopped(cause) -> None:
    """Exit after Ctrl-C (130) or SIGTERM/SIGHUP (128 + the signal), one line."""
    if isinstance(cause, Terminated):
        click.echo(f"error: {cause.reason}; started jobs were cancelled", err=True)
        sys.exit(128 + cause.signum)
    click.echo("error: interrupted", err=True)
    sys.exit(130)


FAULT_ADVICE = {errno.ENOSPC: "free space there or give another output folder (-o)",
                errno.EDQUOT: "free space there or give another output folder (-o)",
                errno.EROFS: "give a writable output folder (-o)",
                errno.EACCES: "check its permissions or give another folder (-o)",
                errno.EPERM: "check its permissions or give another folder (-o)",
                errno.ENAMETOOLONG: "give a shorter path",
                errno.ENOTDIR: "a part of the path is a file, not a folder",
                errno.EISDIR: "it is a folder, not a file"}
"""What to do about each file-system error a command may meet."""


def file_option_advice(option: str) -> dict[int, str]:
    """``FAULT_ADVICE`` for a command whose output is one file, named by ``option``
    (``compare --markdown FILE``), not a folder given with -o."""
    return {**FAULT_ADVICE,
            errno.ENOSPC: f"free space there or give another {option} file",
            errno.EDQUOT: f"free space there or give another {option} file",
            errno.EROFS: f"give a {option} file in a writable folder",
            errno.EACCES: f"check its permissions or give another {option} file",
            errno.EPERM: f"check its permissions or give another {option} file"}


def environment_fault(exc: OSError, advice_by_errno: dict[int, str] = FAULT_ADVICE) -> str:
    """One line for an OSError: what failed, on which file, and the fix."""
    name = exc.filename if exc.filename is not None else "a file"
    what = exc.strerror or type(exc).__name__
    advice = advice_by_errno.get(exc.errno)
    return f"{what}: {name}" + (f" ({advice})" if advice else "")
