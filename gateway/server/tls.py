"""TLS contexts: SMQPS listeners, and the client side of an SMQPS session's notify connection."""

from __future__ import annotations

import ssl

from schemas.config import GatewayConfig


def notify_tls_context(config: GatewayConfig) -> ssl.SSLContext:
    """The client side of a TLS session's SET NOTIFY PORT connection: TLS 1.2+, the listener's
    certificate checked against ``notify_tls_ca`` (else the system's CAs) and the address dialled."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=config.notify_tls_ca or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def tls_context(config: GatewayConfig) -> ssl.SSLContext:
    """SMQPS: TLS 1.2+ with the configured certificate chain and key (standard library ``ssl``)."""
    if not (config.tls_cert and config.tls_key):
        raise ValueError("[gateway] tls_port needs tls_cert and tls_key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.tls_cert, config.tls_key)
    return context
