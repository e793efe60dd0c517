"""User-facing errors and the exit codes the CLI returns.

One exception type per exit code, so a caller of the Python API (fuse_cli.public) can tell them
apart with `except`: InputError (2), CheckFailed (1), InternalError (3); all are FuseErrors.
"""

EXIT_OK = 0
EXIT_CHECK_FAILED = 1  # the tool worked, but a check (verification, CI gate) said no
EXIT_USAGE = 2  # bad input, bad options, unreadable or unwritable files
EXIT_INTERNAL = 3  # a bug in fuse: the CLI says so in one line (--debug shows the traceback)


class FuseError(Exception):
    """An error whose message is fit to show a user as one line, without a traceback."""

    exit_code = EXIT_USAGE


class InputError(FuseError):
    """Bad input (exit 2): a model fuse cannot read, options that make no sense, a file that
    cannot be written. The Python API raises every exit-2 error as this type."""


class ModelLoadError(InputError):
    """The input is not a model fuse can read."""


class UsageError(InputError):
    """Options or configuration that do not make sense."""


class CheckFailed(FuseError):
    """The tool worked but a check said no (exit 1): outputs that differ, passes rolled back, a CI
    gate. `failures` says what, one line each; `result` is what was checked (the model is still
    there: a rolled-back pass leaves a correct model)."""

    exit_code = EXIT_CHECK_FAILED

    def __init__(self, failures: tuple[str, ...], result: object = None):
        super().__init__("; ".join(failures) or "a check failed")
        self.failures = failures
        self.result = result


class InternalError(FuseError):
    """fuse itself got something wrong (not the input, not the options): said in one line."""

    exit_code = EXIT_INTERNAL
