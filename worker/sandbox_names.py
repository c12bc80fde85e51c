"""How a sandbox without network looks names up: in `/etc/hosts` (and the host's own name),
never a DNS server.

A job without `network` has its own loopback and nothing else (`worker.sandbox`), yet it saw
the host's `/etc/nsswitch.conf`, whose `hosts` line sends a name or an address that misses
`/etc/hosts` on to DNS. No server is reachable there, so glibc answered "temporary failure
in name resolution" (EAI_AGAIN) where the truth is "not known": PyTorch's c10d, which names
the peer of each connection to its store (`::ffff:127.0.0.1`, a form `/etc/hosts` does not
hold), warned on every one of them ("The hostname of the client socket cannot be retrieved.
err=-3") in every DDP job's log, and a program that retries a temporary failure waits for
nothing. Such a sandbox sees a copy of the host's switch whose `hosts` line keeps `files` (and
`myhostname` where the host has it) alone: a lookup that misses fails at once as unknown,
and an address is named by its number. A sandbox with network keeps the host's switch."""

from __future__ import annotations

import os
from pathlib import Path

NSSWITCH = Path("/etc/nsswitch.conf")
OFFLINE = "nsswitch-offline.conf"
"""The copy's name in towerq's own folder of the host (never shown whole to a job)."""
LOCAL_SOURCES = ("files", "myhostname")
"""The `hosts` sources that answer without the network."""


def offline_switch(said: str) -> str:
    """The host's name service switch `said`, its `hosts` line made local."""
    lines, sources = [], ["files"]
    for line in said.splitlines():
        database, colon, rest = line.partition(":")
        if colon and database.strip() == "hosts":
            sources = [source for source in LOCAL_SOURCES if source in rest.split()] or sources
        else:
            lines.append(line)
    return "\n".join([*lines, f"hosts: {' '.join(sources)}"]) + "\n"


def offline_names(folder: Path) -> list[str]:
    """bwrap's options that show `offline_switch` of the host's at `/etc/nsswitch.conf`,
    written in `folder`; none where the host has no such file (glibc's defaults then) or it
    is a link."""
    try:
        if NSSWITCH.is_symlink() or not NSSWITCH.is_file():
            return []
        text = offline_switch(NSSWITCH.read_text())
    except (OSError, UnicodeDecodeError):
        return []
    copy = folder / OFFLINE
    try:
        current = copy.read_text() if copy.is_file() and not copy.is_symlink() else None
    except (OSError, UnicodeDecodeError):
        current = None
    if current != text:
        folder.mkdir(parents=True, exist_ok=True)
        written = folder / f".{OFFLINE}.{os.getpid()}.{os.urandom(4).hex()}"
        with open(os.open(written, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "w") as out:
            os.fchmod(out.fileno(), 0o644)  # whatever the umask: the job's user reads it
            out.write(text)
        written.replace(copy)
    return ["--ro-bind", str(copy), str(NSSWITCH)]
