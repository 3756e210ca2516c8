"""``tls``: serve HTTPS (and, with ``client_ca_file``, require client certificates: mTLS).

A process key: the same block serves ``listen`` and ``admin_listen``. The files are read when
the server starts (:func:`gpugate.server.server_tls`), so a wrong path or a key that does not
match its certificate is one clear error naming the key, not a failed handshake later.
"""

from __future__ import annotations

from gpugate.config.fields import ConfigModel, Name


class TlsConfig(ConfigModel):
    """The server's certificate chain and key (PEM), and the CA bundle client certificates must
    chain to (``null``: no client certificate is asked for)."""

    cert_file: Name
    key_file: Name
    client_ca_file: Name | None = None
