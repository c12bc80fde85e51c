"""The `towerq` command's member side: its parser and how its errors end.

`pip install towerq` (the client, without the `server` extra) runs this alone: the member
commands (`submit`, `jobs`, `show`, `follow`, `run`, `notebook`, ...) and, for a server
command, a one-line answer naming the extra. With the server installed, `service.cli` adds
the server and admin commands, and their errors, around it."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from towerq.cli import commands, plain, session
from towerq.client import AuthError, TowerqError, UnreachableError

EXIT_USAGE = 2
EXIT_UNREACHABLE = 4
EXIT_BROKEN_PIPE = 128 + 13
"""Exit codes a script can trust: 0 done (a followed job succeeded), 1 failed (the job, or
the API refused), 2 usage (argparse's too), 3 a followed job was cancelled, 4 the API is
unreachable or refused the token, 141 the reader of its output went away (`| head`), as for
any command a SIGPIPE ends."""

SERVER_COMMANDS = ("up", "api", "worker", "scheduler", "db", "health", "simulate", "admin")
"""The commands of the server (`service.cli`), which a client-only install does not have."""
SERVER_EXTRA = "pip install 'towerq[server]'"


def client_parser(missing: str | None = None) -> argparse.ArgumentParser:
    """The member commands; with `missing` (the server's package that is not installed), the
    server commands are named in the help and answer with the extra to install."""
    epilog = None
    if missing is not None:
        epilog = f"server commands ({', '.join(SERVER_COMMANDS)}) need the server: {SERVER_EXTRA}"
    top = argparse.ArgumentParser(prog="towerq", description="Multi-GPU training service.", epilog=epilog)
    subcommands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_commands(subcommands)
    return top


def run(args: argparse.Namespace, handler: Callable[[argparse.Namespace], int | None]) -> int:
    """Run a parsed command; the errors a member meets end as one line and an exit code.
    What else it raises (the server's own errors) goes to the caller."""
    plain.install()  # no terminal escapes from what members and trainers wrote
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `towerq jobs | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return EXIT_BROKEN_PIPE
    except session.UsageError as err:
        print(f"towerq: {err}", file=sys.stderr)
        return EXIT_USAGE
    except (UnreachableError, AuthError) as err:  # no API, or it does not accept the token
        print(f"towerq: {err}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (TowerqError, session.ClientError) as err:  # the API refused: the message names the field or the cause
        print(f"towerq: {err}", file=sys.stderr)
        return 1


def client_main(argv: list[str] | None, missing: str) -> int:
    """`towerq` where the server's packages are not installed (`missing` is the first one
    looked for)."""
    words = sys.argv[1:] if argv is None else argv
    if words and words[0] in SERVER_COMMANDS:
        print(
            f"towerq: `towerq {words[0]}` is a server command, and this install is the client only "
            f"(no module {missing!r}): {SERVER_EXTRA}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    args = session.parse_command_line(client_parser(missing), words)
    return run(args, args.run)
