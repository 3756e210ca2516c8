"""The exceptions of ``modal.exception`` that gpugate meets, with the SDK's names and bases."""

import builtins


class Error(Exception):
    """Base class of the SDK's errors."""


class AuthError(Error):
    """The token was refused."""


class ConnectionError(Error):  # noqa: A001 - the SDK's own name
    """Modal's servers could not be reached."""


class NotFoundError(Error):
    """No such app, function or call."""


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001 - the SDK's own name
    """Modal's timeouts are the built-in TimeoutError too."""


class FunctionTimeoutError(TimeoutError):
    """The function ran past its timeout."""


class OutputExpiredError(TimeoutError):
    """Modal no longer holds the call's output."""


class InputCancellation(BaseException):
    """The call was cancelled."""
