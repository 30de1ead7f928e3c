"""The network switched off for every Python started with this folder on PYTHONPATH.

Python imports `sitecustomize` at start-up, so a notebook kernel, a worker process it spawns,
or a build script started with `PYTHONPATH=tests/offline` gets a socket module that refuses any
connection and any name lookup outside this machine, the way a laptop without Wi-Fi would
(an OSError). Loopback stays open: Jupyter talks to its kernels over 127.0.0.1 and notebooks 11
and 12 join their worker processes there. Every refused attempt is also appended to the file
named by COURSE_NETWORK_LOG, so that code which catches the OSError and carries on is caught
all the same: `python3 course.py test` fails when that file is not empty after the run.

What it cannot see: connections made by C code that does not go through Python's socket module
(ZeroMQ, gloo); those used here are all loopback. Node.js programs get the same guard from
`no_network.cjs` beside this file (NODE_OPTIONS=--require).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import traceback

LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", ""}


class NetworkSwitchedOff(OSError):
    """A connection or name lookup outside this machine, attempted while the network is off."""


def is_local(host: object) -> bool:
    """True for loopback addresses and names (and an unnamed host, which means this machine)."""
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if not isinstance(host, str):
        return False
    host = host.split("%", 1)[0].strip("[]")
    if host.lower() in LOCAL_NAMES:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or address.is_unspecified or bool(mapped and mapped.is_loopback)


def refuse(what: str) -> None:
    log = os.environ.get("COURSE_NETWORK_LOG")
    if log:
        where = "".join(traceback.format_stack(limit=6)[:-2])
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"pid {os.getpid()}: {what}\n{where}\n")
    raise NetworkSwitchedOff(f"the network is switched off in this run (tests/offline): {what}")


def guarded_connect(original):
    def connect(self: socket.socket, address: object, *args: object) -> object:
        if self.family in (socket.AF_INET, socket.AF_INET6) and not is_local(address[0]):
            refuse(f"connect to {address!r}")
        return original(self, address, *args)
    return connect


def is_address(host: object) -> bool:
    """True for an address written in digits, which needs no lookup ("192.0.2.2", "::1")."""
    try:
        ipaddress.ip_address(host.decode() if isinstance(host, bytes) else str(host))
    except ValueError:
        return False
    return True


def guarded_getaddrinfo(original):
    def getaddrinfo(host: object, *args: object, **kwargs: object) -> object:
        if not (is_local(host) or is_address(host)):  # connect() then checks where it goes
            refuse(f"name lookup of {host!r}")
        return original(host, *args, **kwargs)
    return getaddrinfo


def switch_off() -> None:
    socket.socket.connect = guarded_connect(socket.socket.connect)
    socket.socket.connect_ex = guarded_connect(socket.socket.connect_ex)
    socket.getaddrinfo = guarded_getaddrinfo(socket.getaddrinfo)
    socket.gethostbyname = guarded_getaddrinfo(socket.gethostbyname)
    socket.create_connection.__globals__["getaddrinfo"] = socket.getaddrinfo


switch_off()
