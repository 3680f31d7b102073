"""User-facing errors: the CLI prints their message on one line and exits non-zero."""


class UserError(Exception):
    """Bad input from the user (a path, a file, a config value). Printed without a traceback."""


class ConfigError(UserError):
    """An unknown config key, a wrong type, or a value out of range."""


class DataError(UserError):
    """A data file that is missing, truncated, malformed or inconsistent."""


class WriteFailed(Exception):
    """A file the run had to write could not be written: a full disk, a quota, an I/O error. Not
    bad input, and not a bug: the CLI prints one line naming the path and the OS's reason (exit
    WRITE_FAILED_EXIT_CODE), the run is recorded failed, its temporary files are removed, and its
    newest committed checkpoint stays resumable once space is freed."""


WRITE_FAILED_EXIT_CODE = 1


def write_failed(path, exc: BaseException, what: str = "", then: str = "continue with --resume auto") -> WriteFailed:
    """The one line for `exc` (an OSError, or a library's wrapper around one) met writing `path`."""
    import errno
    # A library that met the OSError may raise its own error over it (torch.save writing into a
    # Python file raises RuntimeError("... unexpected pos ...") from the ENOSPC): the OS's reason
    # is the one to show.
    cause, seen = exc, set()
    while cause is not None and not isinstance(cause, OSError) and id(cause) not in seen:
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    exc = cause if isinstance(cause, OSError) else exc
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else (str(exc).splitlines() or [""])[0][:160]
    full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return WriteFailed(f"{what or 'the run'} could not write {path} ({reason}); "
                       f"{'free space there' if full else 'fix that'} and {then}")


class NonFiniteLossError(Exception):
    """The loss became inf/NaN in a precision mode that has no loss scaling to absorb it: the
    training diverged. Not bad input (the config was valid), so it has its own exit code; the CLI
    prints the message on one line."""


DIVERGED_EXIT_CODE = 4


class RunPruned(Exception):
    """A hyperparameter search stopped this run early: its metric trailed the other trials'.
    Not an error: the run is recorded as 'pruned' and the CLI exits with PRUNED_EXIT_CODE."""


PRUNED_EXIT_CODE = 3


class Terminated(BaseException):
    """SIGTERM (a scheduler's stop, `kill`, torchrun stopping a job's other workers), raised in the
    main thread so a run ends as it does on Ctrl-C: recorded as interrupted, its folder's lock
    released, exit TERMINATED_EXIT_CODE. A BaseException, as KeyboardInterrupt is, so no
    `except Exception` swallows it."""


INTERRUPTED_EXIT_CODE = 130   # 128 + SIGINT, what a shell reports for Ctrl-C
TERMINATED_EXIT_CODE = 143    # 128 + SIGTERM


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's message in one line, for a one-line error or warning (its type's name where
    it has no message): third-party errors (a database driver, a tracking server) span many."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


# What scaletrain was doing when a user's code raised (the sample read, the step taken), added to
# the exception as a note (PEP 678): notes travel with it, out of a DataLoader worker too (its
# formatted traceback holds them), and the CLI shows them on the failure's one line
# (user_code/failures.py).
NOTE_PREFIX = "(scaletrain) "
USER_CODE_FAILED_EXIT_CODE = 1   # the user's code raised (a user's broken contract is a UserError: 2)


def add_context(exc: BaseException, doing: str) -> None:
    """Notes on `exc` that it was raised while `doing` (e.g. "reading sample 300 of mine (train)")."""
    exc.add_note(NOTE_PREFIX + doing)
