"""The error a Ray task or actor call raised, out of the wrappers Ray puts around it on its way to
the caller: a ``RayTaskError`` per hop (the task's, and Ray Data's coordinator actor's when its
executor runs there). Ray makes each wrapper an instance of the cause's class too
(``RayTaskError(ValueError)``), so ``except ValueError`` catches it, but its text is the remote
traceback, not the error's own line."""
from __future__ import annotations


def raised_error(failed: BaseException) -> BaseException:
    """The innermost error under Ray's ``RayTaskError`` wrappers; ``failed`` itself where it is
    not wrapped (Ray's own failures, a lost actor, are not)."""
    from ray.exceptions import RayTaskError

    while isinstance(failed, RayTaskError) and isinstance(failed.cause, BaseException):
        failed = failed.cause
    return failed
