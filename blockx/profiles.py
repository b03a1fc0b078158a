"""Profiles: the kinds of worker one binary can run, as data.

A profile names its deployment (what it registers as), its service name (for
traces and metrics), which builders and plugins it has, and which built-in
defaults it changes (where it registers in etcd among them). Defaults are the profile
layer of the configuration: the file, the environment and the flags still
win over them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final

import attrs

from blockx.config import WorkerConfig
from blockx.settings import ConfigError

DEPLOYMENTS: Final = {"block": "/workers/", "bundle": "/bundle-workers/"}
"""Each deployment's registry prefix ends with its own segment."""


def _frozen(mapping: Mapping[str, object]) -> Mapping[str, object]:
    return MappingProxyType(dict(mapping))


@attrs.frozen(kw_only=True)
class Requirement:
    """A setting a profile's builders or writers need, and why."""

    field: str
    env: str
    read: Callable[[WorkerConfig], str]
    why: str


@attrs.frozen(kw_only=True)
class Profile:
    """A kind of worker: what it registers as and which builders and plugins it has."""

    deployment: str
    service: str
    builders: tuple[str, ...]
    plugins: tuple[str, ...]
    defaults: Mapping[str, object] = attrs.field(factory=dict, converter=_frozen, hash=False)
    """Built-in defaults it changes, by JSON path ("streamBuild.enabled": True): the
    profile layer of the configuration."""
    requires: tuple[Requirement, ...] = ()
    """Settings its builders and writers cannot do without: the worker refuses to start
    while one is empty, naming it."""

    def check(self, config: WorkerConfig) -> None:
        """Raise ConfigError unless `config` fits this profile."""
        segment = DEPLOYMENTS.get(self.deployment)
        if segment is None:
            raise ConfigError(
                field="profile",
                value=self.deployment,
                allowed=f"one of {', '.join(sorted(DEPLOYMENTS))}",
            )
        prefix = config.etcd.registry_prefix
        if not (prefix.startswith("/") and prefix.endswith(segment)):
            raise ConfigError(
                field="workerRegistryPrefix",
                value=prefix,
                allowed=f"the {self.deployment} profile registers under a prefix that "
                f"starts with '/' and ends with {segment!r}",
            )
        for requirement in self.requires:
            if not requirement.read(config):
                raise ConfigError(
                    field=requirement.field,
                    value="",
                    allowed=f"the {self.deployment} profile needs it (env {requirement.env}): "
                    f"{requirement.why}",
                )


BLOCK: Final = Profile(
    deployment="block",
    service="blockx-worker",
    builders=("dbscan", "call_list", "bundle_scan", "static", "payload"),
    plugins=("log", "test", "jsonl", "result", "table_upserts", "bundle_write"),
)
BUNDLE: Final = Profile(
    deployment="bundle",
    service="blockx-bundle-worker",
    builders=("bundle_scan", "call_list"),
    plugins=("bundle_write", "table_upserts"),
    defaults={"workerRegistryPrefix": "/blockx/bundle-workers/", "streamBuild.enabled": True},
    requires=(
        Requirement(
            field="io.bundleRoot",
            env="BUNDLE_ROOT",
            read=lambda config: config.io.bundle_root,
            why="bundle_scan and bundle_write read and write bundles under it",
        ),
        Requirement(
            field="io.tableDatabase",
            env="TABLE_UPSERTS_DATABASE",
            read=lambda config: config.io.table_database,
            why="table_upserts writes there (a SQLite file, duckdb:PATH or a postgresql:// URL)",
        ),
    ),
)
PROFILES: Final = {profile.deployment: profile for profile in (BLOCK, BUNDLE)}
