"""The bodies of ``/admin/keys`` and ``/admin/usage`` (DESIGN §3, wave 2; issue #16)."""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, BeforeValidator, Field

from gpugate.core.keys import TENANT_NAME, ClientKey, parse_rfc3339
from gpugate.web.schemas.common import Day, Key, Query, RequestBody, Timestamp, View

_TENANT = TENANT_NAME
MAX_LIST = 256  # models or runners a key may name


def _tenant(name: str) -> str:
    if _TENANT.fullmatch(name) is None:
        raise ValueError("expected 1-64 letters, digits, '.', '_' or '-'")
    return name


Tenant = Annotated[
    str, Field(json_schema_extra={"pattern": _TENANT.pattern}), AfterValidator(_tenant)
]
ClassName = Literal["system", "interactive", "batch"]
Rfc3339 = Annotated[
    AwareDatetime,
    Field(strict=False, description="RFC 3339 with its offset: 2026-01-01T00:00:00+00:00"),
    BeforeValidator(parse_rfc3339),  # text only: no Unix seconds, no date alone
]


class LimitsBody(RequestBody):
    """Each limit; null (or absent) = unlimited. Minutes and days are UTC, fixed windows."""

    requests_per_min: int | None = Field(None, ge=1)
    tokens_per_min: int | None = Field(None, ge=1)
    concurrency: int | None = Field(None, ge=1)
    daily_tokens: int | None = Field(None, ge=1)
    daily_cents: float | None = Field(None, ge=0)


class KeyCreate(RequestBody):
    """A new client key: who it is for and what it may do."""

    name: Key
    tenant: Tenant
    models: list[Key] | None = Field(None, max_length=MAX_LIST, description="null: every model")
    max_class: ClassName = Field(
        "interactive", description="a higher X-Request-Class is clamped down to this"
    )
    runners: list[Key] | None = Field(
        None, max_length=MAX_LIST, description="the runtimes its jobs may name; null: every one"
    )
    allow_external: bool = False
    limits: LimitsBody | None = Field(None, description="null or absent: no limits")
    expires_at: Rfc3339 | None = None


class KeyUpdate(RequestBody):
    """The fields to change (absent: unchanged); `limits` is replaced whole."""

    name: Key | None = None
    tenant: Tenant | None = None
    models: list[Key] | None = Field(None, max_length=MAX_LIST)
    max_class: ClassName | None = None
    runners: list[Key] | None = Field(None, max_length=MAX_LIST)
    allow_external: bool | None = None
    limits: LimitsBody | None = None
    expires_at: Rfc3339 | None = None


class LimitsView(View):
    requests_per_min: int | None
    tokens_per_min: int | None
    concurrency: int | None
    daily_tokens: int | None
    daily_cents: float | None


class KeyView(View):
    """A client key as the admin API shows it: never its secret."""

    id: str
    name: str
    tenant: str
    prefix: str = Field(description="the secret's first characters, for display and logs")
    models: list[str] | None
    max_class: ClassName
    runners: list[str] | None
    allow_external: bool
    limits: LimitsView
    expires_at: Timestamp | None
    created_at: Timestamp | None
    revoked_at: Timestamp | None

    @classmethod
    def of_key(cls, key: ClientKey) -> KeyView:
        return cls(**key_data(key))


class KeyIssued(KeyView):
    """A key just created or rotated: `key` is its secret, shown this once."""

    key: str

    @classmethod
    def of_issued(cls, key: ClientKey, secret: str) -> KeyIssued:
        return cls(**key_data(key), key=secret)


def key_data(key: ClientKey) -> dict[str, Any]:
    return {
        "id": key.id,
        "name": key.name,
        "tenant": key.tenant,
        "prefix": key.prefix,
        "models": None if key.models is None else list(key.models),
        "max_class": key.max_class.value,
        "runners": None if key.runners is None else list(key.runners),
        "allow_external": key.allow_external,
        "limits": LimitsView(**key.limits.as_dict()),
        "expires_at": key.expires_at,
        "created_at": key.created_at,
        "revoked_at": key.revoked_at,
    }


class KeyList(View):
    data: list[KeyView]


class KeyPath(Query):
    id: Key


class KeyListQuery(Query):
    tenant: Key | None = None


class UsageQuery(Query):
    """Filters of `GET /admin/usage`; `from`/`to` are UTC days, inclusive."""

    key: Key | None = Field(None, description="a key's id")
    tenant: Key | None = None
    model: Key | None = None
    since: date | None = Field(None, alias="from")
    until: date | None = Field(None, alias="to")


class UsageRowView(View):
    day: Day
    key: str
    tenant: str
    model: str
    upstream: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cents: float


class UsageTotal(View):
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cents: float


class UsageView(View):
    """Usage rows (per day, key, model, upstream) and their totals per key and per tenant."""

    data: list[UsageRowView]
    by_key: dict[str, UsageTotal]
    by_tenant: dict[str, UsageTotal]
