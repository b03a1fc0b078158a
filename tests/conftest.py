"""Hypothesis settings profiles shared by every test layer.

`dev` keeps local runs short; `ci` runs ten times the examples and prints the
blob that reproduces a failure. HYPOTHESIS_PROFILE names the profile; without
it, CI=true (any value but "", "0" or "false") selects `ci`, else `dev`.
"""

import os

from hypothesis import settings

# Hypothesis loads its own derandomized "ci" profile by itself whenever a CI
# variable is set; basing both profiles on "default" keeps them independent of
# that, so CI runs stay randomized.
_BASE = settings.get_profile("default")
settings.register_profile("dev", _BASE, max_examples=100, stateful_step_count=50, deadline=None)
settings.register_profile(
    "ci", _BASE, max_examples=1000, stateful_step_count=60, deadline=None, print_blob=True
)


def _profile_name() -> str:
    if explicit := os.environ.get("HYPOTHESIS_PROFILE"):
        return explicit
    on_ci = os.environ.get("CI", "").lower() not in {"", "0", "false"}
    return "ci" if on_ci else "dev"


settings.load_profile(_profile_name())
