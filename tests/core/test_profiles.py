"""Profiles: what each registers as, and the registry prefix each accepts."""

from __future__ import annotations

import pytest

from blockx.config import load_config
from blockx.phases.builders import KNOWN_BUILDERS
from blockx.phases.plugins import KNOWN_PLUGINS
from blockx.profiles import BLOCK, BUNDLE, PROFILES, Profile
from blockx.settings import ConfigError

REGISTRY_PREFIXES = {"block": "/blockx/workers/", "bundle": "/blockx/bundle-workers/"}
"""Where each profile registers by default."""


BUNDLE_SETTINGS = {"BUNDLE_ROOT": "/srv/bundles", "TABLE_UPSERTS_DATABASE": "/srv/out.db"}


def test_each_profile_accepts_its_own_defaults() -> None:
    assert set(PROFILES) == set(REGISTRY_PREFIXES)
    for profile in PROFILES.values():
        config = load_config(profile=profile.defaults, env=BUNDLE_SETTINGS)
        profile.check(config)
        assert config.etcd.registry_prefix == REGISTRY_PREFIXES[profile.deployment]


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        (
            "BUNDLE_ROOT",
            "io.bundleRoot = '': the bundle profile needs it (env BUNDLE_ROOT): bundle_scan "
            "and bundle_write read and write bundles under it",
        ),
        (
            "TABLE_UPSERTS_DATABASE",
            "io.tableDatabase = '': the bundle profile needs it (env TABLE_UPSERTS_DATABASE): "
            "table_upserts writes there (a SQLite file, duckdb:PATH or a postgresql:// URL)",
        ),
    ],
)
def test_the_bundle_profile_refuses_to_start_without_its_writers_settings(
    missing: str, message: str
) -> None:
    env = {k: v for k, v in BUNDLE_SETTINGS.items() if k != missing}
    with pytest.raises(ConfigError) as raised:
        BUNDLE.check(load_config(profile=BUNDLE.defaults, env=env))
    assert raised.value.describe() == message
    BLOCK.check(load_config(env={}))  # the block profile's tasks name their own


def test_the_bundle_profile_changes_defaults_that_file_and_env_still_beat() -> None:
    tuned = load_config(profile=BUNDLE.defaults, env={})
    assert (tuned.etcd.registry_prefix, tuned.stream_build.enabled) == (
        "/blockx/bundle-workers/",
        True,
    )
    env = {"STREAM_BUILD_ENABLED": "false"}
    assert not load_config(profile=BUNDLE.defaults, env=env).stream_build.enabled


@pytest.mark.parametrize(
    ("profile", "prefix"),
    [(BLOCK, "/blockx/bundle-workers/"), (BUNDLE, "/blockx/workers/"), (BLOCK, "blockx/workers/")],
)
def test_a_registry_prefix_of_another_deployment_is_refused(profile: Profile, prefix: str) -> None:
    config = load_config(profile=profile.defaults, env={"WORKER_REGISTRY_PREFIX": prefix})
    with pytest.raises(ConfigError) as raised:
        profile.check(config)
    assert raised.value.field == "workerRegistryPrefix"
    assert f"the {profile.deployment} profile" in str(raised.value)


def test_the_prefix_error_says_what_the_profile_accepts() -> None:
    config = load_config(profile=BUNDLE.defaults, env={"WORKER_REGISTRY_PREFIX": "/x/workers/"})
    with pytest.raises(ConfigError) as raised:
        BUNDLE.check(config)
    assert raised.value.allowed == (
        "the bundle profile registers under a prefix that starts with '/' and ends with "
        "'/bundle-workers/'"
    )


def test_profiles_name_only_builders_and_plugins_that_exist() -> None:
    for profile in PROFILES.values():
        assert set(profile.builders) <= set(KNOWN_BUILDERS)
        assert set(profile.plugins) <= set(KNOWN_PLUGINS)
    assert set(BLOCK.builders) == set(KNOWN_BUILDERS)
    assert set(BLOCK.plugins) == set(KNOWN_PLUGINS)


def test_the_bundle_profile_has_the_reference_builders_writers_and_streams() -> None:
    assert set(BUNDLE.builders) == {"bundle_scan", "call_list"}
    assert set(BUNDLE.plugins) == {"bundle_write", "table_upserts"}
    assert BUNDLE.defaults["streamBuild.enabled"] is True
    assert BLOCK.builders[:3] == ("dbscan", "call_list", "bundle_scan")


def test_an_unknown_deployment_is_refused() -> None:
    odd = Profile(
        deployment="batch",
        service="x",
        builders=(),
        plugins=(),
        defaults={"workerRegistryPrefix": "/blockx/batch/"},
    )
    with pytest.raises(ConfigError) as raised:
        odd.check(load_config(env={}))
    assert raised.value.field == "profile"
