"""The three kinds of failure a user can meet, told apart so that each gets the right answer.

- `UserError`: the input is wrong (a spec, a layout, a flag, a file). One line that names the
  input and what to do; exit code 2.
- `SetupError`: the machine is not fit to go on (no compiler, disk full, a cache directory that
  is unwritable or not the user's own). One line; exit code 3. Never recorded against a candidate:
  a tune stops with every finished record on disk, and the same command resumes.
- anything else is a bug in tuner: the command line prints a short crash report and the path of
  a file holding the traceback, and exits 70, so that a bug never looks like the user's fault.
"""
from __future__ import annotations


class TunerError(Exception):
    exit_code = 2


class UserError(TunerError, ValueError):
    """Bad input: a one-line message that names the input and what to do."""
    exit_code = 2


class GraphError(UserError):
    """A model's graph is invalid or cannot be compiled (names the node)."""


class SetupError(TunerError, RuntimeError):
    """The environment failed (not a candidate, not the input): stop and say what to fix."""
    exit_code = 3


INTERNAL_ERROR_EXIT = 70     # EX_SOFTWARE: a bug in tuner


def check_output_path(path, flag: str) -> None:
    """A file to write or append to: a regular file or nothing yet, in a directory that exists (made
    if need be) and that we may write."""
    import os
    from pathlib import Path
    p = Path(path)
    try:
        if p.exists() and not p.is_file():
            raise UserError(f"{flag} {path} is not a regular file (it is a directory or a device); give a file path")
    except OSError as e:
        raise UserError(f"cannot use {flag} {path} ({e.strerror}); choose another {flag}") from None
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create {p.parent} for {flag} {path} ({e.strerror}); choose another {flag}") from None
    if not os.access(p.parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UserError(f"cannot write {flag} {path}: permission denied; choose another {flag}")


def check_bound(flag: str, value, least: float, inclusive: bool = True) -> None:
    """Refuse an option below its least value (or at it, when that is excluded), or not finite."""
    import math
    if value is None:
        return
    if not math.isfinite(value) or value < least or (value == least and not inclusive):
        raise UserError(f"{flag} must be {'at least' if inclusive else 'more than'} {least}, got {value}")
