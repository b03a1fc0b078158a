"""Every check CI runs, one session each: `nox -s <name>` reproduces CI.

Sessions install from `uv.lock` only (`uv sync --locked`), each with just the
dependency group it needs, into the session's own virtualenv. `soak` is no
check of CI's: it runs for minutes, so only `nox -s soak` runs it.
"""

import nox

nox.options.default_venv_backend = "uv"
nox.options.reuse_venv = "yes"
nox.options.error_on_external_run = True
nox.options.sessions = ["lint", "typecheck", "tests", "property"]


def sync(session: nox.Session, *groups: str) -> None:
    """Install the project and `groups` exactly as locked."""
    group_args = [arg for group in groups for arg in ("--group", group)]
    session.run_install(
        "uv",
        "sync",
        "--locked",
        "--no-default-groups",
        *group_args,
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
        external=True,
    )


@nox.session
def lint(session: nox.Session) -> None:
    sync(session, "lint")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    sync(session, "typecheck")
    session.run("mypy", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    sync(session, "test")
    session.run(
        "pytest", "tests/core", "tests/adapters", "tests/sim", "tests/e2e", *session.posargs
    )


@nox.session(name="property")
def property_tests(session: nox.Session) -> None:
    sync(session, "test")
    session.run("pytest", "tests/property", *session.posargs, env={"HYPOTHESIS_PROFILE": "ci"})


@nox.session
def soak(session: nox.Session) -> None:
    """bench/soak.py: many clients on one worker for 5 minutes; arguments after -- go to it."""
    sync(session)
    session.run("python", "bench/soak.py", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site (docs/ -> docs/_build/html) in strict mode: any
    warning, a broken link or cross-reference among them, fails the build."""
    sync(session, "docs")
    session.run(
        "sphinx-build", "--fail-on-warning", "--nitpicky", "--fresh-env",
        "--builder", "html", "docs", "docs/_build/html", *session.posargs,
    )  # fmt: skip


@nox.session
def screenshots(session: nox.Session) -> None:
    """Regenerate the pages' screenshots the docs show (docs/images/*.png): the browser
    tests of the worker's status page and the hub's dashboard take them as they run."""
    sync(session, "test")
    session.run(
        "pytest", "-p", "no:randomly", "tests/e2e/test_status_page.py",
        "tests/e2e/test_hub_dashboard.py", *session.posargs,
        env={"BLOCKX_TEST_ARTIFACTS": "docs/images"},
    )  # fmt: skip


@nox.session
def protos(session: nox.Session) -> None:
    """Fail on drift between protos/ and blockx/_proto/; `-- --write` regenerates."""
    sync(session, "protos")
    if session.posargs == ["--write"]:
        session.run("python", "tools/gen_protos.py", "blockx/_proto")
    elif not session.posargs:
        session.run("python", "tools/gen_protos.py", "--check", "blockx/_proto")
    else:
        session.error(f"unknown arguments {session.posargs}; the only option is --write")
