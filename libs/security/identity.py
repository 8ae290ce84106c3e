"""Who a peer is: a role and a name, carried in a certificate as a SAN URI
`spiffe://fornax/<role>/<name>`."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

TRUST_DOMAIN = "fornax"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


class Role(enum.Enum):
    OPERATOR = "operator"
    CLIENT = "client"
    STAGE = "stage"
    SERVICE = "service"
    HOST = "host"


class IdentityError(ValueError):
    """A name or URI that is not a Fornax identity."""


@dataclass(frozen=True)
class Identity:
    role: Role
    name: str

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise IdentityError(f"identity names are lower-case [a-z0-9_.-], got {self.name!r}")

    @property
    def uri(self) -> str:
        return f"spiffe://{TRUST_DOMAIN}/{self.role.value}/{self.name}"

    @property
    def file_stem(self) -> str:
        return f"{self.role.value}-{self.name}"

    def __str__(self) -> str:
        return f"{self.role.value}/{self.name}"

    @classmethod
    def from_uri(cls, uri: str) -> Identity:
        prefix = f"spiffe://{TRUST_DOMAIN}/"
        if not uri.startswith(prefix):
            raise IdentityError(f"not a {TRUST_DOMAIN} identity URI: {uri!r}")
        parts = uri[len(prefix):].split("/")
        if len(parts) != 2:
            raise IdentityError(f"identity URI must be {prefix}<role>/<name>: {uri!r}")
        try:
            role = Role(parts[0])
        except ValueError as exc:
            raise IdentityError(f"unknown role {parts[0]!r} in {uri!r}") from exc
        return cls(role, parts[1])

    @classmethod
    def parse(cls, text: str) -> Identity:
        """`role/name`, as the CLI spells it."""
        role, _, name = text.partition("/")
        try:
            return cls(Role(role), name)
        except ValueError as exc:
            raise IdentityError(f"expected <role>/<name> with role in {[r.value for r in Role]}, got {text!r}") from exc


def stage_identity(stage_index: int) -> Identity:
    return Identity(Role.STAGE, f"stage-{stage_index}")


def service_identity(kind: str) -> Identity:
    return Identity(Role.SERVICE, kind.replace("_", "-"))
