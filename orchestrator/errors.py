"""The project's errors: one base, ``OrchestratorError``, that carries the process exit code and the
word the command line reports it under (``orchestrator: <word>: <message>``), and the exit codes.

Every error the project defines derives from it (and, where callers catch it as such, from the
builtin it refines: a ``ChecksumMismatch`` is also a ``ValueError``), so the command line reads an
error's code and word off the error (``cli._reported``) instead of testing its kind against a list.
Errors of outside systems (S3, PostgreSQL, SQLite, Ray) become ``OutsideSystemError`` where they
arise: the lineage store's engine (``lineage.sessions``), the storage's file operations
(``storage.filesystem``), joining a Ray cluster (``distributed.runtime``), the pgvector store, and
the checks before a command (``orchestrator.outside``). Nothing here imports beyond the standard
library: the command line reports an error of a command that imported nothing else.
"""
from __future__ import annotations

import enum
from typing import Any, Callable, ClassVar


class ExitCode(enum.IntEnum):
    """The process exit status of every command (docs/cli.md)."""

    OK = 0
    FAILED = 1  # a runtime failure: a failed step, a storage or database problem
    USAGE = 2  # bad arguments, a bad pipeline / tune file or value: nothing was started
    HELD = 3  # the deployment gate held a generation back (nothing broke, nothing was deployed)
    BUSY = 4  # another process holds the pipeline's run lock (nothing was done)
    INTEGRITY = 5  # a stored file is not what the lineage recorded (any file), or verify checked nothing
    UNREACHABLE = 6  # S3, PostgreSQL, SQLite or Ray did not answer or refused (the line names which, and where)
    UNHEALTHY = 7  # the health check stopped a generation at train:<gen> (nothing of it evaluated or deployed)


class OrchestratorError(Exception):
    """An error of this project. ``exit_code``: the command line's exit status for it; ``reported_as``:
    the word its one line starts with after ``orchestrator:``. Subclasses set both."""

    exit_code: ClassVar[ExitCode] = ExitCode.FAILED
    reported_as: ClassVar[str] = "failed"
    #: The command line shows this error's traceback under ``-v`` instead of its one line.
    traceback_under_verbose: ClassVar[bool] = False

    def report_line(self) -> str:
        """The one line the command line prints (without ``orchestrator: ``)."""
        return f"{self.reported_as}: {self}"


class UsageError(OrchestratorError):
    """Bad input (a file, a field, a value, a name the lineage does not know): nothing was started."""

    exit_code = ExitCode.USAGE
    reported_as = "error"


class StoredFileError(OrchestratorError):
    """A stored file is not what the lineage recorded."""

    exit_code = ExitCode.INTEGRITY
    reported_as = "integrity"


class OutsideSystemError(OrchestratorError):
    """An outside system (S3, PostgreSQL, SQLite, Ray) did not answer or refused: one line naming
    the system, its location (credentials redacted) and what to check. The command line shows its
    traceback under ``-v``. Picklable with its fields (it crosses from a Ray worker to the driver),
    subclasses too."""

    exit_code = ExitCode.UNREACHABLE
    reported_as = "unreachable"
    traceback_under_verbose = True

    def __init__(self, system: str, location: str, problem: str, check: str):
        self.system, self.location = system, location
        super().__init__(f"{system} at {location}: {problem}; check {check}")

    def __reduce__(self) -> tuple[Callable[..., OutsideSystemError], tuple[Any, ...]]:
        return (_rebuild_outside, (type(self), self.system, self.location, str(self)))


def _rebuild_outside(kind: type[OutsideSystemError], system: str, location: str, message: str) -> OutsideSystemError:
    error = kind.__new__(kind)
    Exception.__init__(error, message)
    error.system, error.location = system, location
    return error


def one_line(error: BaseException, limit: int = 300) -> str:
    """``error``'s message on one line (white space folded), at most ``limit`` characters; its type's
    name when it has none."""
    return " ".join(str(error).split())[:limit] or type(error).__name__
