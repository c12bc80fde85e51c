"""The `towerq` command: servers (`up`, `api`, `worker`, `scheduler`, `db`), admin
(`token`, `user`), the trace simulator (`simulate`), and the client commands of `towerq.cli`
(`submit`, `jobs`, `show`, `cancel`, `logs`, `gpus`, ...), which sit on the Python client."""

from __future__ import annotations

import argparse
import logging
import os
import sys

import redis
from sqlalchemy.exc import OperationalError

from service.cli import admin, server
from service.cli.redis_server import RedisUnavailableError
from service.core.db import SchemaError
from service.core.keyspace import KeyspaceError
from service.core.settings import Settings, redacted
from service.executors import UnknownExecutorError
from towerq.cli import commands, plain, session
from towerq.client import AuthError, TowerqError, UnreachableError


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="towerq", description="Multi-GPU training service.")
    subcommands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    server.add_commands(subcommands)
    admin.add_commands(subcommands)
    commands.add_commands(subcommands)
    return top


EXIT_USAGE = 2
EXIT_UNREACHABLE = 4
EXIT_BROKEN_PIPE = 128 + 13
"""Exit codes a script can trust: 0 done (a followed job succeeded), 1 failed (the job, or
the API refused), 2 usage (argparse's too), 3 a followed job was cancelled, 4 the API is
unreachable or refused the token, 141 the reader of its output went away (`| head`), as for
any command a SIGPIPE ends."""


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    plain.install()  # no terminal escapes from what members and trainers wrote
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    for chatty in ("alembic", "httpx", "rq.worker"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        return int(args.run(args) or 0)
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
    except TowerqError as err:  # the API refused: the message names the field or the cause
        print(f"towerq: {err}", file=sys.stderr)
        return 1
    except (session.ClientError, RedisUnavailableError, SchemaError, KeyspaceError, UnknownExecutorError) as err:
        print(f"towerq: {err}", file=sys.stderr)
        return 1
    except OperationalError as err:  # the database refused the credentials or did not answer
        reason = str(err.orig or err).strip().splitlines()[0]
        print(f"towerq: cannot use the database at {redacted(Settings().database_url)}: {reason}", file=sys.stderr)
        return 1
    except (redis.AuthenticationError, redis.ConnectionError) as err:
        print(f"towerq: cannot use Redis at {redacted(Settings().redis_url)}: {err}", file=sys.stderr)
        return 1
