"""Example text functions. Sibling modules are imported relatively: `from . import demo`."""

from . import demo


def upper(s: str) -> str:
    return s.upper()


def shout(s: str) -> object:
    """`upper`, passed through `demo.echo` to show a relative import inside an epoch."""
    return demo.echo(upper(s) + "!")
