"""The base of every config model, and the value types the models share.

Every model is strict (a YAML ``"64"`` is not the integer 64), frozen and forbids unknown keys.
Each constrained string type checks its value in one small function whose message says what was
expected.
"""

from __future__ import annotations

import re
from typing import Annotated, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from gpugate.config.paths import describe

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HOST = re.compile(r"[^\s/\[\]]+")
_IPV6 = re.compile(r"[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*(%\w+)?")
_STORE_PREFIXES = ("sqlite:///", "postgresql://", "postgres://")
# libpq's connection parameters that hold a secret (a URL's query may carry any of them)
_SECRET_STORE_PARAMS = frozenset({"password", "sslpassword"})
_MAX_PORT = 65535


class ConfigModel(BaseModel):
    """A block of the configuration: strict, frozen, unknown keys are errors.

    Dumping drops a ``None`` only where ``None`` is also the default, so that a dump read back
    is the same config (an explicit ``budget: null`` over a default budget survives).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    @model_serializer(mode="wrap")
    def _drop_default_nones(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name, info in type(self).model_fields.items():
            if name in data and data[name] is None and info.default is None:
                del data[name]
        return data


def _identifier(value: str) -> str:
    if not _ID.fullmatch(value):
        raise ValueError(
            "expected an id of letters, digits, '.', '_' or '-' starting with a letter or digit,"
            f" got {value!r}"
        )
    return value


def _env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise ValueError(
            "expected the name of an environment variable (letters, digits and '_',"
            f" not starting with a digit), got {value!r}; the secret itself never goes here"
        )
    return value


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
    return value


def _http_url_or_empty(value: str) -> str:
    return value and _http_url(value)


def _exporter_host(value: str) -> str:
    if not _HOST.fullmatch(value):
        raise ValueError(f"expected a host name without '/' or spaces, got {value!r}")
    return value


def _store_url(value: str) -> str:
    if not value.startswith(_STORE_PREFIXES):
        raise ValueError(
            f"expected a URL starting with sqlite:///, postgresql:// or postgres://, got {value!r}"
        )
    return value


def redact_store_url(value: str) -> str:
    """The store URL without any password, fit for a log line, a summary or a repr: the user
    info's password and the query parameters that carry one (``password``, ``sslpassword``)
    are dropped; everything else (user, host, port, database, other parameters) is kept."""
    if "://" not in value or value.startswith("sqlite:"):
        return value
    parts = urlsplit(value)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username}@{host}" if parts.username else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    query = [
        (name, kept)
        for name, kept in parse_qsl(parts.query, keep_blank_values=True)
        if name.lower() not in _SECRET_STORE_PARAMS
    ]
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query), ""))


def _url_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"expected a path starting with '/', got {value!r}")
    return value


def split_listen(value: str) -> tuple[str, int]:
    """``"127.0.0.1:8080"`` → ``("127.0.0.1", 8080)``; ``"[::1]:8080"`` → ``("::1", 8080)``."""
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        valid_host = bool(_IPV6.fullmatch(host))
    else:
        valid_host = bool(_HOST.fullmatch(host)) and ":" not in host
    if not (sep and valid_host and port.isdigit() and int(port) <= _MAX_PORT):
        raise ValueError(f"expected host:port (e.g. 127.0.0.1:8080 or [::1]:8080), got {value!r}")
    return host, int(port)


def _listen(value: str) -> str:
    split_listen(value)
    return value


def _gpu_id(value: Any) -> int | str:
    """A GPU of an upstream: an index (``0``) or ``"host/index"``; the form is checked later."""
    if isinstance(value, int | str) and not isinstance(value, bool):
        return value
    raise ValueError(f"expected a GPU index (0) or 'host/index' (node-a/0), got {describe(value)}")


Identifier = Annotated[str, AfterValidator(_identifier)]
EnvName = Annotated[str, AfterValidator(_env_name)]
HttpUrl = Annotated[str, AfterValidator(_http_url)]
HttpUrlOrEmpty = Annotated[str, AfterValidator(_http_url_or_empty)]
ExporterHost = Annotated[str, AfterValidator(_exporter_host)]
StoreUrl = Annotated[str, AfterValidator(_store_url)]
UrlPath = Annotated[str, AfterValidator(_url_path)]
ListenAddress = Annotated[str, AfterValidator(_listen)]
GpuId = Annotated[int | str, PlainValidator(_gpu_id, json_schema_input_type=int | str)]
Name = Annotated[str, Field(min_length=1)]
Seconds = Annotated[float, Field(ge=0)]
PositiveSeconds = Annotated[float, Field(gt=0)]
