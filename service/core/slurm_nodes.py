"""Where a Slurm node is reached: its `NodeAddr`, as Slurm says it. A notebook session's door
listens there on the node, and the API's proxy reaches it there. A cluster whose node names
do not resolve (on the API's machine, or on the node itself) gives each node an address of
its own in slurm.conf; where it gives none, Slurm says the name. Asked by the API (the
executor, `service.executors.slurm`) and by the node's runner (`worker.slurm`), each with
its own way to run a command."""

from __future__ import annotations

SEP = "|"
ASK_TIMEOUT_S = 30.0
"""How long the node's runner waits for Slurm's word."""


def address_command(node: str) -> list[str]:
    """`sinfo` asked for `node`'s name and address, one line per partition it is in."""
    return ["sinfo", "--Node", "--noheader", f"--nodes={node}", f"--format=%N{SEP}%o"]


def parse_address(out: str, node: str) -> str | None:
    """`address_command`'s word for `node`'s address; None where it names none."""
    for line in out.splitlines():
        name, _, address = line.partition(SEP)
        if name.strip() == node and address.strip():
            return address.strip()
    return None
