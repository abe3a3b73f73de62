"""Which hosts and origins a browser may reach this server through, against DNS rebinding
and cross-site requests: a page that rebinds its own name to 127.0.0.1 still sends that
name as `Host`, and a page of another site that posts to the API sends its `Origin`.

- `Host`: an IP address is always accepted (a rebinding page presents a name it owns);
  a name must be `localhost` or under `.localhost`, this machine's name, the address the
  server is bound to, or one of `--allowed-hosts` (`*`: any; `.example.com`: the domain and
  its subdomains). Checked where the server listens on a loopback address (the default)
  or where `--allowed-hosts` is given: bound to every interface (a container, a cluster),
  the server is reached by names it cannot know, and `--api-key` is the guard there.
- `Origin`, on requests that change something (POST, PUT, PATCH, DELETE): absent (not a
  browser), the server's own (the chat page), or one of `--cors-origins` (`*`: any)."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _is_ip(name: str) -> bool:
    """An IP address, in any spelling a resolver takes (127.1, 2130706433): never a name
    someone could point at this machine."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        try:
            socket.inet_aton(name)
        except OSError:
            return False
    return True


def host_name(value: str) -> str:
    """The name in a `Host` header (or an origin's netloc), without its port, lower case."""
    value = value.strip().lower()
    if value.startswith("["):  # [::1]:8000
        return value[1:value.find("]")] if "]" in value else value
    name, _, port = value.rpartition(":")
    return (name if name and port.isdigit() else value).rstrip(".")


class HostPolicy:
    """The allowed hosts and origins, decided once from the settings."""

    def __init__(self, bound: str, allowed_hosts: list[str], cors_origins: list[str]):
        addresses = listen_addresses(bound)
        self.any_host = "*" in allowed_hosts
        self.check_hosts = not self.any_host and (bool(allowed_hosts) or all(_loopback(a) for a in addresses))
        names = {"localhost", socket.gethostname().lower(), *(a.strip("[]").lower() for a in addresses)}
        self.names = names | {h.lower().rstrip(".") for h in allowed_hosts if not h.startswith(".")}
        self.domains = tuple(h.lower().rstrip(".") for h in allowed_hosts if h.startswith("."))
        self.any_origin = "*" in cors_origins
        self.origins = {o.rstrip("/").lower() for o in cors_origins}

    def host_allowed(self, host: str | None) -> bool:
        if not self.check_hosts or host is None:  # no Host: HTTP/1.0, never a browser
            return True
        name = host_name(host)
        return (_is_ip(name) or name in self.names or name.endswith(".localhost")
                or any(name == d[1:] or name.endswith(d) for d in self.domains))

    def origin_allowed(self, method: str, origin: str | None, host: str | None) -> bool:
        if origin is None or method not in STATE_CHANGING or self.any_origin:
            return True
        origin = origin.strip().rstrip("/").lower()
        if origin in self.origins:
            return True
        parts = urlsplit(origin)  # "null" (a sandboxed frame, a file) has no netloc: refused
        return bool(parts.netloc) and host is not None and parts.netloc == host.strip().lower()


def listen_addresses(host: str) -> list[str]:
    """The addresses of the --host setting: one, or several comma-separated."""
    return [h.strip() for h in host.split(",") if h.strip()] or ["127.0.0.1"]


def _loopback(bound: str) -> bool:
    if bound.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(bound.strip("[]")).is_loopback
    except ValueError:
        return False
