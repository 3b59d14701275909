"""Ports: truthput owns --host/--port, so it must find free ones and know when they are free again."""

from __future__ import annotations

import socket
import time

ALL_IPV4 = ("", "0", "0.0.0.0")
ALL_IPV6 = ("::", "[::]", "::0", "0:0:0:0:0:0:0:0")


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def bind_host(host: str) -> str:
    """The address to bind or probe as the server would (IPv6 without brackets)."""
    return host.strip("[]") if ":" in host else host


def client_host(host: str) -> str:
    """Where a client reaches a server told to listen on `host`: any spelling of "all addresses"
    ("0", "0.0.0.0", "::") is this machine's IPv4 loopback, which such a server also listens on
    (an IPv6 "::" binding is dual-stack by default on Linux; the simulator binds 127.0.0.1)."""
    if host in ALL_IPV4 or host in ALL_IPV6:
        return "127.0.0.1"
    return bind_host(host)


def base_url(host: str, port: int) -> str:
    """http://HOST:PORT for a client, an IPv6 address in brackets."""
    h = client_host(host)
    return f"http://[{h}]:{port}" if ":" in h else f"http://{h}:{port}"


def free_port(host: str = "127.0.0.1") -> int:
    host = bind_host(host) if host not in ALL_IPV4 else "0.0.0.0"
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on host:port (we try to bind it, as the server would)."""
    host = bind_host(host) if host not in ALL_IPV4 else "0.0.0.0"
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def port_is_listening(port: int, host: str = "127.0.0.1") -> bool:
    host = client_host(host)
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def wait_port_free(port: int, host: str = "127.0.0.1", timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not port_is_listening(port, host):
            return True
        time.sleep(0.05)
    return not port_is_listening(port, host)
