"""Credentials: how a token is made, shown once, and checked.

A token is `bxc_<credential id>.<secret>`; the database keeps only a SHA-256
of the secret. A credential is scoped to one queue (or every queue) with
rights: producer (submit and read tasks), worker (run them), admin.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Final

from blockx.hub._committer import Committer
from blockx.hub._model import Credential, Right
from blockx.hub._store import Tx

TOKEN_PREFIX: Final = "bxc_"


def new_token() -> tuple[str, str, str]:
    """(credential id, token, hash of its secret) for a new credential."""
    credential_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(24)
    return credential_id, f"{TOKEN_PREFIX}{credential_id}.{secret}", secret_hash(secret)


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _parts(token: str) -> tuple[str, str] | None:
    """(credential id, secret) of a token of the right form."""
    credential_id, dot, secret = token.removeprefix(TOKEN_PREFIX).partition(".")
    if not token.startswith(TOKEN_PREFIX) or not dot or not credential_id or not secret:
        return None
    return credential_id, secret


def credential_ids(token: str) -> tuple[str, ...]:
    """The id of the credential `token` names, if it has the form of one (unchecked)."""
    parts = _parts(token)
    return () if parts is None else (parts[0],)


def check(tx: Tx, token: str) -> Credential | None:
    """The credential `token` stands for, or None (unknown, malformed, wrong secret)."""
    parts = _parts(token)
    if parts is None:
        return None
    credential_id, secret = parts
    found = tx.credential(credential_id)
    if found is None:
        return None
    credential, expected = found
    if not secrets.compare_digest(secret_hash(secret), expected):
        return None
    return None if credential.revoked else credential


def is_admin(tx: Tx, token: str) -> bool:
    """Whether `token` stands for a valid, unrevoked credential with the admin right."""
    credential = check(tx, token)
    return credential is not None and Right.ADMIN in credential.rights


async def authenticate(committer: Committer, token: str) -> Credential | None:
    return await committer.do(lambda tx: check(tx, token))
