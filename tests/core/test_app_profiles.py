"""Profiles: what each registers as, and the registry prefix each accepts."""

from __future__ import annotations

import pytest

from blockx.app import BLOCK, BUNDLE, PROFILES, Profile
from blockx.config import ConfigError, load_config
from blockx.phases.builders import KNOWN_BUILDERS
from blockx.phases.plugins import KNOWN_WRITERS


def test_each_profile_accepts_its_own_defaults() -> None:
    for profile in PROFILES.values():
        config = load_config(tune=profile.tune, env={})
        profile.check(config)
        assert config.worker_registry_prefix == profile.registry_prefix


def test_the_bundle_profile_tunes_defaults_that_file_and_env_still_beat() -> None:
    tuned = load_config(tune=BUNDLE.tune, env={})
    assert (tuned.worker_registry_prefix, tuned.stream_build.enabled) == (
        "/blockx/bundle-workers/",
        True,
    )
    env = {"STREAM_BUILD_ENABLED": "false"}
    assert not load_config(tune=BUNDLE.tune, env=env).stream_build.enabled


@pytest.mark.parametrize(
    ("profile", "prefix"),
    [(BLOCK, "/blockx/bundle-workers/"), (BUNDLE, "/blockx/workers/"), (BLOCK, "blockx/workers/")],
)
def test_a_registry_prefix_of_another_deployment_is_refused(profile: Profile, prefix: str) -> None:
    config = load_config(tune=profile.tune, env={"WORKER_REGISTRY_PREFIX": prefix})
    with pytest.raises(ConfigError) as raised:
        profile.check(config)
    assert raised.value.field == "workerRegistryPrefix"
    assert f"the {profile.deployment} profile" in str(raised.value)


def test_profiles_name_only_builders_and_writers_that_exist() -> None:
    for profile in PROFILES.values():
        assert set(profile.builders) <= set(KNOWN_BUILDERS)
        assert set(profile.writers) <= set(KNOWN_WRITERS)
    assert set(BLOCK.builders) == set(KNOWN_BUILDERS)
    assert set(BLOCK.writers) == set(KNOWN_WRITERS)


def test_an_unknown_deployment_is_refused() -> None:
    odd = Profile(
        deployment="batch",
        service="x",
        registry_prefix="/blockx/batch/",
        builders=(),
        writers=(),
    )
    with pytest.raises(ConfigError) as raised:
        odd.check(load_config(env={}))
    assert raised.value.field == "profile"
