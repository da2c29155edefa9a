"""NATS decentralized auth made on the spot: an operator, an account and users, as nkeys and signed JWTs.

Used by the data-plane tests of `bus.nats.credentialsSecret` (tests/dataplane/test_bus_credentials.py) to run
a real nats-server that REQUIRES credentials: operator mode with a memory resolver, the account preloaded.
What `nsc` would write, in ~100 lines:

- a JWT (v2) is ``base64url(header).base64url(claims).base64url(signature)``, unpadded, the header
  ``{"typ": "JWT", "alg": "ed25519-nkey"}``, signed by the issuer's nkey (operator signs accounts, account
  signs users; the operator signs itself);
- the account's JWT gives JetStream limits (-1 = unlimited), without which the bus's streams are refused;
- a ``.creds`` file is the user's JWT and nkey seed between the standard armour lines; nats-py reads it with
  ``user_credentials=<path>`` (it signs the server's nonce with the seed).

Example::

    auth = natsauth.Operator.create()
    account = auth.account("asyncrl")
    conf = auth.server_config([account])           # nats-server -c <file>
    account.user("rollout").write_creds(path)
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import pathlib
import time
from typing import Any

import nkeys

UNLIMITED_ACCOUNT = {
    "subs": -1,
    "data": -1,
    "payload": -1,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
    "mem_storage": -1,
    "disk_storage": -1,
    "streams": -1,
    "consumer": -1,
}
"""Account limits: nothing capped, JetStream (memory and file storage) enabled."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclasses.dataclass(frozen=True)
class Key:
    """An nkey pair: ``seed`` (secret, starts with S) and ``public`` (starts with O, A or U)."""

    seed: bytes
    public: str

    @classmethod
    def create(cls, prefix: int) -> Key:
        seed = nkeys.encode_seed(os.urandom(32), prefix)
        return cls(seed, nkeys.from_seed(bytearray(seed)).public_key.decode())

    def sign_jwt(self, subject: str, name: str, nats: dict[str, Any]) -> str:
        """A JWT v2 with these ``nats`` claims about ``subject``, issued and signed by this key."""
        claims: dict[str, Any] = {"iat": int(time.time()), "iss": self.public, "name": name, "sub": subject}
        claims["nats"] = {**nats, "version": 2}
        claims["jti"] = base64.b32encode(hashlib.sha256(json.dumps(claims).encode()).digest()).decode()
        header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
        body = f"{header}.{_b64(json.dumps(claims).encode())}"
        signature = nkeys.from_seed(bytearray(self.seed)).sign(body.encode())
        return f"{body}.{_b64(signature)}"


@dataclasses.dataclass(frozen=True)
class User:
    key: Key
    jwt: str

    def creds(self) -> str:
        """The ``.creds`` file text (the format `nsc` writes and every NATS client reads)."""
        return (
            f"-----BEGIN NATS USER JWT-----\n{self.jwt}\n------END NATS USER JWT------\n\n"
            "************************* IMPORTANT *************************\n"
            "NKEY Seed printed below can be used to sign and prove identity.\n"
            "NKEYs are sensitive and should be treated as secrets.\n\n"
            f"-----BEGIN USER NKEY SEED-----\n{self.key.seed.decode()}\n------END USER NKEY SEED------\n\n"
            "*************************************************************\n"
        )

    def write_creds(self, path: pathlib.Path) -> pathlib.Path:
        path.write_text(self.creds(), encoding="utf-8")
        path.chmod(0o600)
        return path


@dataclasses.dataclass(frozen=True)
class Account:
    key: Key
    jwt: str

    def user(self, name: str) -> User:
        """A user of this account, no permissions limits."""
        key = Key.create(nkeys.PREFIX_BYTE_USER)
        nats = {"type": "user", "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1}
        return User(key, self.key.sign_jwt(key.public, name, nats))


@dataclasses.dataclass(frozen=True)
class Operator:
    key: Key
    system: Account

    @classmethod
    def create(cls) -> Operator:
        key = Key.create(nkeys.PREFIX_BYTE_OPERATOR)
        sys_key = Key.create(nkeys.PREFIX_BYTE_ACCOUNT)
        system = Account(sys_key, key.sign_jwt(sys_key.public, "SYS", {"type": "account", "limits": {}}))
        return cls(key, system)

    def account(self, name: str) -> Account:
        """An account signed by this operator, JetStream enabled without limits."""
        key = Key.create(nkeys.PREFIX_BYTE_ACCOUNT)
        nats = {"type": "account", "limits": UNLIMITED_ACCOUNT, "default_permissions": {"pub": {}, "sub": {}}}
        return Account(key, self.key.sign_jwt(key.public, name, nats))

    def jwt(self) -> str:
        nats = {"type": "operator", "system_account": self.system.key.public}
        return self.key.sign_jwt(self.key.public, "asyncrl-test", nats)

    def server_config(self, accounts: list[Account]) -> str:
        """nats-server config text: operator mode, these accounts (and the system account) preloaded in a
        memory resolver; a client must present a user JWT of one of them."""
        preload = {a.key.public: a.jwt for a in [self.system, *accounts]}
        lines = [f"operator: {self.jwt()}", f"system_account: {self.system.key.public}", "resolver: MEMORY"]
        lines += ["resolver_preload: {", *(f"  {pub}: {jwt}" for pub, jwt in preload.items()), "}"]
        return "\n".join(lines) + "\n"
