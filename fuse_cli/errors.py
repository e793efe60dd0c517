"""User-facing errors and the exit codes the CLI returns."""

EXIT_OK = 0
EXIT_CHECK_FAILED = 1  # the tool worked, but a check (verification, CI gate) said no
EXIT_USAGE = 2  # bad input, bad options, unreadable or unwritable files
EXIT_INTERNAL = 3  # a bug in fuse: the CLI says so in one line (--debug shows the traceback)


class FuseError(Exception):
    """An error whose message is fit to show a user as one line, without a traceback."""

    exit_code = EXIT_USAGE


class ModelLoadError(FuseError):
    """The input is not a model fuse can read."""


class UsageError(FuseError):
    """Options or configuration that do not make sense."""


class InternalError(FuseError):
    """fuse itself got something wrong (not the input, not the options): said in one line."""

    exit_code = EXIT_INTERNAL
