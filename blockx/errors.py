"""The project's error bases, and how an error message shows a value.

Every error blockx raises on purpose derives from `BlockxError`. Two kinds of
fault have one base each, and each carries typed fields, not a formatted
string:

* `InvalidValue`: a value someone gave (a setting, a request field, a flag,
  a task-file key) is not allowed: `field` names it as the person typed it,
  `value` is what was given, `allowed` says what would be accepted.
* `Misuse`: code drove a component in a way the component never allows (a
  bug in the caller, not bad input): `what` says what happened.

This module imports nothing of blockx, so every package can depend on it, the
pure cores included.
"""

from __future__ import annotations

from typing import Final

SHOWN_CHARS: Final = 80
"""How much of an offending value a message quotes."""


def shown(value: object) -> str:
    """`repr(value)`, cut to `SHOWN_CHARS` characters."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


class BlockxError(Exception):
    """Base of every error raised by blockx."""


class InvalidValue(BlockxError):
    """`value` given for `field` is not allowed; `allowed` says what is.

    Subclasses say where the value came from (a request, a setting, a flag) and
    may word the message differently through `describe`; the fields stay.
    """

    def __init__(self, *, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(self.describe())

    @classmethod
    def check(cls, ok: bool, *, field: str, value: object, allowed: str) -> None:
        """Raise this error for `field` unless `ok`."""
        if not ok:
            raise cls(field=field, value=value, allowed=allowed)

    def describe(self) -> str:
        return f"{self.field}={shown(self.value)} is invalid: {self.allowed}"


class Misuse(BlockxError):
    """A component was driven in a way it never allows: a bug in its caller.

    The component's state is left as it was before the call.
    """

    def __init__(self, *, what: str) -> None:
        self.what = what
        super().__init__(what)


class StartupError(BlockxError):
    """A process cannot start: a port is taken, a directory is missing. Its message is one
    line that names what is missing and, where there is one, the setting that chose it."""
