"""The one settings machinery: settings declared once, loaded in layers, errors naming the source.

Every program of blockx (the worker, the hub, the command line's clients)
declares its settings as an attrs class whose fields are made by `setting`
(a default, a JSON name, an environment variable, a kind of value) or
`section` (a nested class of settings). Everything else is worked out from
those declarations: loading, checking, rendering and the help text. Must
never read the environment or a file except when `load` is called, and never
start anything.

Theory of operation:

* A setting's JSON path is its name everywhere: in the file, in errors, in
  overrides. A section is a JSON object (`worker.*`) or, with an empty JSON
  name, a group of top-level names that the code still reads as one section.
* Layers, later ones win: built-in defaults -> the caller's defaults (a
  worker's profile) -> the JSON file named by a flag or by the program's file
  variable (`WORKER_CONFIG`, `HUB_CONFIG`; only the keys it holds) ->
  environment variables -> overrides (command-line flags). The loader records
  which layer gave each value, so an error says where a bad value came from,
  in the user's terms: the file, the variable, or the flag that was typed.
* An empty environment variable counts as unset for numbers, booleans and
  durations (a templated `TASK_SLOTS=` should not break a server) but as a
  value for text, where empty means something.
* A secret (a bearer token) is never read from the file, never rendered, and
  left out of `repr`: it comes from the environment or a flag only.
* The settings class checks itself when made (`check_positive` and its own
  rules); every failure is a `ConfigError` naming the setting by its JSON path.
"""

from __future__ import annotations

import decimal
import difflib
import functools
import json
import os
import re
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any, Final, TypeVar, cast

import attrs

from blockx.errors import InvalidValue, shown

T = TypeVar("T")


class ConfigError(InvalidValue):
    """A setting is missing its form or out of range. `field` is its JSON path.

    `source` says which layer gave the value ("default", "profile",
    "file /etc/worker.json", "env TASK_SLOTS", "--slots") when that is known.
    """

    def __init__(
        self, *, field: str, value: object, allowed: str, source: str | None = None
    ) -> None:
        self.source = source
        super().__init__(field=field, value=value, allowed=allowed)

    def describe(self) -> str:
        where = f" (from {self.source})" if self.source else ""
        return f"{self.field} = {shown(self.value)}{where}: {self.allowed}"

    def from_source(self, source: str | None) -> ConfigError:
        return ConfigError(field=self.field, value=self.value, allowed=self.allowed, source=source)


class FlagError(InvalidValue):
    """The value given to the command-line flag `field` is wrong; `allowed` says what it
    must be. The one error of every command's flags that argparse cannot check itself."""

    def describe(self) -> str:
        return f"{self.field} {self.value!r}: {self.allowed}"


# --- kinds of value ------------------------------------------------------------------------
#
# A kind reads a value from JSON (or an override) and from environment text,
# and renders it back to JSON. Readers raise ValueError("must be ...") which
# the loader turns into a ConfigError carrying the path and the source.


@attrs.frozen
class Kind:
    from_json: Callable[[object], object]
    from_text: Callable[[str], object]
    to_json: Callable[[Any], object] = lambda value: value
    empty_text_is_unset: bool = True


def _int_from_json(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("must be an integer")
    return value


def _int_from_text(text: str) -> int:
    if not re.fullmatch(r"[+-]?[0-9]+", text.strip()):
        raise ValueError("must be an integer")
    return int(text)


def _bool_from_json(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


_TRUE_TEXTS = frozenset({"1", "t", "true", "yes", "on"})
_FALSE_TEXTS = frozenset({"0", "f", "false", "no", "off"})


def _bool_from_text(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE_TEXTS:
        return True
    if lowered in _FALSE_TEXTS:
        return False
    raise ValueError("must be true or false (also 1/0, yes/no, on/off)")


def _str_from_json(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    return value


def _float_from_json(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number")
    return float(value)


def _float_from_text(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError("must be a number") from None


_DURATION_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign, as Go accepts
    "\u03bcs": 1_000,  # Greek mu, as Go accepts
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_DURATION_FORM = "must be a Go duration such as 2s, 200ms or 1m30s"


def parse_duration_ms(text: str) -> int:
    """Whole milliseconds of a Go duration ("2s", "1m30s", "1.5h", "0"), truncated like Go's.

    Raises ValueError for anything Go's `time.ParseDuration` refuses.
    """
    body = text.strip()
    sign = -1 if body.startswith("-") else 1
    if body.startswith(("-", "+")):
        body = body[1:]
    if body == "0":
        return 0
    total_ns = decimal.Decimal(0)
    position = 0
    while position < len(body):
        part = _DURATION_PART.match(body, position)
        if part is None:
            raise ValueError(_DURATION_FORM)
        total_ns += decimal.Decimal(part[1]) * _DURATION_UNITS_NS[part[2]]
        position = part.end()
    if position == 0:
        raise ValueError(_DURATION_FORM)
    return sign * int(total_ns / 1_000_000)


INT: Final = Kind(from_json=_int_from_json, from_text=_int_from_text)
BOOL: Final = Kind(from_json=_bool_from_json, from_text=_bool_from_text)
STR: Final = Kind(from_json=_str_from_json, from_text=str, empty_text_is_unset=False)
FLOAT: Final = Kind(from_json=_float_from_json, from_text=_float_from_text)
DURATION_MS: Final = Kind(from_json=_int_from_json, from_text=parse_duration_ms)
"""Milliseconds in JSON, a Go duration in the environment."""

LOG_FORMATS: Final = ("auto", "json", "text")
"""Every server's `logFormat` (`LOG_FORMAT`): "auto" is text when stderr is a terminal,
JSON lines otherwise."""


def check_choice(value: str, choices: tuple[str, ...], *, field: str) -> None:
    """ConfigError naming `field` unless `value` is one of `choices`."""
    ConfigError.check(
        value in choices,
        field=field,
        value=value,
        allowed="must be " + " or ".join(", ".join(f'"{c}"' for c in choices).rsplit(", ", 1)),
    )


def parse_listen_addr(text: str) -> tuple[str, int]:
    """(host, port) to bind of "host:port", ":port" (every IPv4 interface) or "[v6]:port".

    Raises ValueError saying what is allowed, for the caller's own error.
    """
    form = 'must be "host:port" or ":port" with a port from 0 to 65535 (0 = any free port)'
    host, colon, port_text = text.rpartition(":")
    if not colon or not re.fullmatch(r"[0-9]{1,5}", port_text) or int(port_text) > 65535:
        raise ValueError(form)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(form + "; write an IPv6 host in brackets")
    if any(char.isspace() for char in host):
        raise ValueError(form)
    return host or "0.0.0.0", int(port_text)


def check_listen_addr(addr: str, *, field: str) -> None:
    """ConfigError naming `field` unless `addr` is an address to listen on
    (`parse_listen_addr`)."""
    try:
        parse_listen_addr(addr)
    except ValueError as error:
        raise ConfigError(field=field, value=addr, allowed=str(error)) from error


# --- declarations --------------------------------------------------------------------------

_SETTING_KEY: Final = "blockx.settings.setting"
_SECTION_KEY: Final = "blockx.settings.section"


@attrs.frozen
class _Declared:
    json_name: str
    env: str | None
    kind: Kind
    positive: bool
    secret: bool


def setting(
    default: object,
    json_name: str,
    env: str | None = None,
    kind: Kind = INT,
    *,
    positive: bool = False,
    secret: bool = False,
) -> Any:
    """A setting: its default, JSON name, environment variable, kind; `positive`: must be
    > 0; `secret`: never from the file, never rendered or shown in `repr`."""
    declared = _Declared(json_name, env, kind, positive, secret)
    return attrs.field(default=default, metadata={_SETTING_KEY: declared}, repr=not secret)


def section(cls: type[Any], json_name: str = "") -> Any:
    """A section of settings, of class `cls`: a JSON object `json_name`, or ("") settings
    with top-level JSON names."""
    return attrs.field(factory=cls, metadata={_SECTION_KEY: json_name})


@attrs.frozen
class Setting:
    """One declared setting, as the table lists it."""

    path: str
    """JSON path, also the name in errors and overrides: "worker.taskSlots"."""
    attributes: tuple[str, ...]
    """Python attribute path: ("worker", "task_slots")."""
    env: str | None
    kind: Kind
    positive: bool
    secret: bool
    default: object

    def get(self, settings: object) -> Any:
        return functools.reduce(getattr, self.attributes, settings)


def _walk(cls: type[Any], path: str = "", attributes: tuple[str, ...] = ()) -> Iterator[Setting]:
    for field in attrs.fields(cls):
        if _SECTION_KEY in field.metadata:
            group = field.metadata[_SECTION_KEY]
            group_path = f"{path}{group}." if group else path
            yield from _walk(field.default.factory, group_path, (*attributes, field.name))
        else:
            declared: _Declared = field.metadata[_SETTING_KEY]
            yield Setting(
                path=path + declared.json_name,
                attributes=(*attributes, field.name),
                env=declared.env,
                kind=declared.kind,
                positive=declared.positive,
                secret=declared.secret,
                default=field.default,
            )


@attrs.frozen
class Table:
    """Every setting a settings class declares, by JSON path."""

    settings: tuple[Setting, ...]
    by_path: Mapping[str, Setting]
    groups: frozenset[str]
    """The JSON paths of sections that are JSON objects."""


def table(cls: type[Any]) -> Table:
    """The table of `cls`, worked out once."""
    return _table(cast(Hashable, cls))  # a class is hashable; to mypy `type[...]` is not


@functools.cache
def _table(cls: Any) -> Table:
    settings = tuple(_walk(cls))
    return Table(
        settings=settings,
        by_path={setting.path: setting for setting in settings},
        groups=frozenset(setting.path.rpartition(".")[0] for setting in settings) - {""},
    )


def check_positive(settings: object) -> None:
    """ConfigError for the first setting declared `positive` whose value is not > 0."""
    for declared in table(type(settings)).settings:
        value = declared.get(settings)
        ConfigError.check(
            not declared.positive or value > 0,
            field=declared.path,
            value=value,
            allowed="must be > 0",
        )


def check_paired(first: tuple[str, str], second: tuple[str, str]) -> None:
    """Two settings, each (value, name), that are set both or neither (a certificate and
    its key); ConfigError naming the one that is set alone."""
    for (given, field), (_, other) in ((first, second), (second, first)):
        ConfigError.check(
            bool(first[0]) == bool(second[0]) or not given,
            field=field,
            value=given,
            allowed=f"needs {other} too: set both or neither",
        )


def check_tls_files(
    cert: tuple[str, str], key: tuple[str, str], client_ca: tuple[str, str]
) -> None:
    """A server's TLS settings, each (value, name): the certificate and its key go together,
    and a client CA only with them. What the files hold is checked when the server starts
    (`blockx.net.tls`)."""
    check_paired(cert, key)
    ConfigError.check(
        bool(cert[0]) or not client_ca[0],
        field=client_ca[1],
        value=client_ca[0],
        allowed=f"needs {cert[1]} and {key[1]}: clients are asked for certificates over TLS only",
    )


def to_json_dict(settings: object) -> dict[str, Any]:
    """The settings under their JSON names (secrets left out); loads back to an equal value
    when no secret is set."""
    rendered: dict[str, Any] = {}
    for declared in table(type(settings)).settings:
        if declared.secret:
            continue
        *groups, name = declared.path.split(".")
        target = rendered
        for group in groups:
            target = target.setdefault(group, {})
        target[name] = declared.kind.to_json(declared.get(settings))
    return rendered


def help_text(cls: type[Any], file_env: str) -> str:
    """Every setting of `cls`, for a command's `--help`: a heading, then `help_lines`."""
    return "\n".join(
        [
            f"settings (the key in the --config file, or {file_env}'s; the environment",
            "variable, - for none; the default):",
            *help_lines(cls),
        ]
    )


def help_lines(cls: type[Any]) -> list[str]:
    """One line per setting of `cls` for a command's help, in columns: its JSON path, its
    environment variable ("-": none), its default (as JSON)."""
    rows = [
        (
            declared.path,
            declared.env or "-",
            "(secret)" if declared.secret else json.dumps(declared.kind.to_json(declared.default)),
        )
        for declared in table(cls).settings
    ]
    path_width = max(len(row[0]) for row in rows)
    env_width = max(len(row[1]) for row in rows)
    return [f"  {path:<{path_width}}  {env:<{env_width}}  {default}" for path, env, default in rows]


def refuse_flags(args: object, names: Iterable[str], allowed: str) -> None:
    """`FlagError` (saying `allowed`) for the first of the flags `names` (their argparse
    names, `task_id` for `--task-id`) that was given in `args`: not None, not False."""
    for name in names:
        value = getattr(args, name)
        if value not in (None, False):
            raise FlagError(field="--" + name.replace("_", "-"), value=value, allowed=allowed)


def flag_overrides(args: object, flags: Mapping[str, str]) -> dict[str, object]:
    """The overrides the command-line `flags` ({JSON path: "--flag-name"}) give in `args`
    (an `argparse.Namespace`): {JSON path: value} for each flag that was given."""
    given = {path: getattr(args, flag[2:].replace("-", "_")) for path, flag in flags.items()}
    return {path: value for path, value in given.items() if value is not None}


# --- loading -------------------------------------------------------------------------------

_Layer = Iterator[tuple[str, object, str]]
"""(JSON path, parsed value, source) for each value a layer sets."""


def load(
    cls: type[T],
    *,
    env: Mapping[str, str] | None = None,
    file_env: str | None = None,
    file: str | None = None,
    defaults: Mapping[str, object] | None = None,
    overrides: Mapping[str, object] | None = None,
    flags: Mapping[str, str] | None = None,
) -> T:
    """`cls` made from its defaults, then `defaults`, the JSON file, `env`, `overrides`.

    `env` defaults to `os.environ`. The file is `file` if given (a flag's), else the one the
    variable `file_env` names, if set. `defaults` and `overrides` map JSON paths
    ("listenAddr", "worker.taskSlots") to typed values; a None override means "not given",
    so that unset command-line flags can be passed as they are. `flags` maps the JSON path
    of an override to the flag that gave it ("worker.taskSlots" -> "--slots"), so that an
    error names what was typed.
    """
    environ = os.environ if env is None else env
    known = table(cls)
    values = {declared.path: declared.default for declared in known.settings}
    sources = dict.fromkeys(known.by_path, "default")
    file_name = file if file is not None else environ.get(file_env, "") if file_env else ""
    file_source = "--config" if file is not None else file_env or "file"
    layers = (
        _mapping_layer(known, defaults or {}, "profile"),
        _file_layer(known, file_name, file_source),
        _env_layer(known, environ),
        _mapping_layer(known, overrides or {}, "override", flags or {}),
    )
    for layer in layers:
        for path, value, source in layer:
            values[path] = value
            sources[path] = source
    try:
        made: T = _build(cls, values)
    except ConfigError as error:
        raise error.from_source(sources.get(error.field)) from error
    return made


def _file_layer(known: Table, file_name: str, named_by: str) -> _Layer:
    if not file_name:
        return
    try:
        with open(file_name, encoding="utf-8") as file:
            document = json.load(file)
    except OSError as error:
        raise ConfigError(
            field=named_by,
            value=file_name,
            allowed=f"the file cannot be read ({error.strerror or error})",
        ) from error
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(
            field=named_by, value=file_name, allowed=f"the file is not valid JSON ({error})"
        ) from error
    if not isinstance(document, dict):
        raise ConfigError(
            field=named_by,
            value=file_name,
            allowed=f"the file must hold a JSON object, not {type(document).__name__}",
        )
    yield from _json_object(known, document, "", f"file {file_name}")


def _json_object(known: Table, document: dict[str, object], prefix: str, source: str) -> _Layer:
    for key, value in document.items():
        path = prefix + key
        if path in known.groups:
            if not isinstance(value, dict):
                raise ConfigError(
                    field=path, value=value, allowed="must be a JSON object", source=source
                )
            yield from _json_object(known, value, f"{path}.", source)
            continue
        declared = _known(known, path, value, source)
        if declared.secret:
            where = declared.env or "a flag"
            raise ConfigError(
                field=path,
                value="(hidden)",
                allowed=f"is a secret: set it with {where}, never in a file",
                source=source,
            )
        yield path, _read(declared.kind.from_json, value, path, source), source


def _env_layer(known: Table, environ: Mapping[str, str]) -> _Layer:
    for declared in known.settings:
        if declared.env is None or declared.env not in environ:
            continue
        text = environ[declared.env]
        if not text and declared.kind.empty_text_is_unset:
            continue
        source = f"env {declared.env}"
        yield declared.path, _read(declared.kind.from_text, text, declared.path, source), source


def _mapping_layer(
    known: Table, values: Mapping[str, object], source: str, flags: Mapping[str, str] | None = None
) -> _Layer:
    for path, value in values.items():
        if value is None:
            continue
        given_by = (flags or {}).get(path, source)
        declared = _known(known, path, value, given_by)
        yield path, _read(declared.kind.from_json, value, path, given_by), given_by


def _known(known: Table, path: str, value: object, source: str) -> Setting:
    declared = known.by_path.get(path)
    if declared is None:
        close = difflib.get_close_matches(path, [*known.by_path, *known.groups], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(field=path, value=value, allowed=f"is not a setting{hint}", source=source)
    return declared


def _read(parse: Callable[[T], object], raw: T, path: str, source: str) -> object:
    try:
        return parse(raw)
    except ValueError as error:
        raise ConfigError(field=path, value=raw, allowed=str(error), source=source) from error


def _build(cls: type[Any], values: Mapping[str, object], prefix: str = "") -> Any:
    """Make `cls` from flat JSON-path values, innermost sections first."""
    arguments: dict[str, object] = {}
    for field in attrs.fields(cls):
        if _SECTION_KEY in field.metadata:
            group = field.metadata[_SECTION_KEY]
            group_path = f"{prefix}{group}." if group else prefix
            arguments[field.name] = _build(field.default.factory, values, group_path)
        else:
            declared: _Declared = field.metadata[_SETTING_KEY]
            arguments[field.name] = values[prefix + declared.json_name]
    return cls(**arguments)
