"""Where towerq may send what a member named: a job's or sweep's `notify_url` reaches public
addresses only, unless an admin allow-listed the host or network (`TOWERQ_WEBHOOK_ALLOW`).

Without this the scheduler's host posted to loopback, link-local (169.254.169.254, a cloud's
metadata service) and the LAN for any member, and each failure's text landed in a log every
member reads: a port and status scanner. An address literal is refused at submit; a host
name is resolved when the notification is sent, every address it has is checked, and the
request goes to the checked address (pinned: the name cannot resolve elsewhere between the
check and the connection). The lab's own `TOWERQ_WEBHOOK_URL` is an admin's and is not
filtered.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from service.core.exceptions import SpecError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class RefusedAddressError(ValueError):
    """A member's URL leads to an address that is not public and not allow-listed."""


def allow_list(setting: str) -> tuple[set[str], list[Network]]:
    """`TOWERQ_WEBHOOK_ALLOW` as host names and networks (`chat.lab.internal, 10.0.5.0/24`)."""
    hosts, networks = set(), []
    for item in (part.strip() for part in setting.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            hosts.add(item.lower().rstrip("."))
    return hosts, networks


IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


def embedded(address: Address) -> list[Address]:
    """`address` and every IPv4 address an IPv6 one carries and that a host may reach it
    by: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), NAT64 (`64:ff9b::/96`,
    its local-use `64:ff9b:1::/48`), 6to4 (`2002::/16`) and Teredo (`2001::/32`, its server and
    client)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return [address]
    found: list[Address] = [address]
    low32 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.ipv4_mapped is not None:
        found.append(address.ipv4_mapped)
    if address in IPV4_COMPATIBLE and int(address) > 1 or any(address in network for network in NAT64):
        found.append(low32)
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found += list(address.teredo)
    return found


def _public(address: Address) -> bool:
    return all(a.is_global and not a.is_multicast for a in embedded(address))


def _allowed(address: Address, host: str, setting: str) -> bool:
    hosts, networks = allow_list(setting)
    if host.lower().rstrip(".") in hosts:
        return True
    return _public(address) or any(address in network for network in networks)


def _host_and_port(url: str) -> tuple[str, int]:
    """The URL's host and port; ValueError when it has no readable host (`http://a]b`)."""
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        raise ValueError(f"{url!r} names no host")
    return host, parts.port or (443 if parts.scheme == "https" else 80)


def check_url(url: str, setting: str, field: str = "notify_url") -> None:
    """At submit: refuse a URL without a readable host, and an address literal that is not
    public nor allow-listed (a host name is checked when the notification is sent: what it
    resolves to may change)."""
    try:
        host, _ = _host_and_port(url)
    except ValueError as err:
        raise SpecError(field, f"not a URL with a host and port towerq can read: {err}") from None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return
    if not _allowed(address, host, setting):
        raise SpecError(field, f"{host} is not a public address; an admin may allow it (TOWERQ_WEBHOOK_ALLOW)")


def resolve(url: str, setting: str) -> str:
    """The address to send `url` to: the first of its host's addresses, once every one of
    them is public or allow-listed; RefusedAddressError otherwise (or when it does not
    resolve)."""
    try:
        host, port = _host_and_port(url)
    except ValueError as err:
        raise RefusedAddressError(str(err)) from err
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as err:
        raise RefusedAddressError(f"{host} does not resolve ({getattr(err, 'strerror', None) or err})") from err
    addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in found))
    refused = [a for a in addresses if not _allowed(a, host, setting)]
    if refused or not addresses:
        raise RefusedAddressError(
            f"refused: {host} is not a public address (members' webhooks reach the internet only; "
            "an admin may allow a host or network with TOWERQ_WEBHOOK_ALLOW)"
        )
    return str(addresses[0])
