"""Which URLs an outgoing webhook may call (issue 27 "Webhooks"): http or https, no
credentials in the URL, a host that resolves, and (unless ``DEXAGENTS_WEBHOOKS_ALLOW_PRIVATE``)
only public addresses.

Checked when a ``Webhook`` is saved (``Webhook.clean``) and again before every send
(``agents_app.notify.webhooks``). Below the models: it imports nothing of the app but its settings.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from agents_app.conf import dexagents_setting

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class WebhookAddressError(ValueError):
    """The URL is not one a webhook may call: bad scheme, credentials in it, a host that
    does not resolve, or one that resolves to a non-public address."""


class WebhookHostUnresolvedError(WebhookAddressError):
    """The URL's host does not resolve (now: a later attempt may succeed)."""


def _address_public(address: IpAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


def webhook_url_check(*, url: str) -> list[IpAddress]:
    """Resolve ``url``'s host and check every address it resolves to.

    Returns:
        The addresses, in the resolver's order (the first is the one to call).

    Raises:
        WebhookAddressError: The scheme is not http or https, the URL carries credentials,
            the host does not resolve, or (unless ``WEBHOOKS_ALLOW_PRIVATE``) an address is
            not public.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookAddressError("Enter an http:// or https:// URL with a host.")
    if parts.username or parts.password:
        raise WebhookAddressError("The URL may not carry a user name or password.")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise WebhookAddressError("The URL's port is not a number from 1 to 65535.") from None
    try:
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise WebhookHostUnresolvedError(
            f"The host {parts.hostname} does not resolve: {error}"
        ) from None
    addresses: list[IpAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise WebhookHostUnresolvedError(f"The host {parts.hostname} does not resolve.")
    if not dexagents_setting("WEBHOOKS_ALLOW_PRIVATE"):
        refused = [str(address) for address in addresses if not _address_public(address)]
        if refused:
            raise WebhookAddressError(
                f"The host {parts.hostname} resolves to a private, loopback or link-local "
                f"address ({', '.join(refused)}); webhooks call public addresses only "
                "(DEXAGENTS_WEBHOOKS_ALLOW_PRIVATE=true lifts this)."
            )
    return addresses
