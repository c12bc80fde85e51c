"""Where a towerq API answers unless told otherwise (the address `towerq up` and `towerq api`
listen on, and the one the client and the CLI look for), and the rules of the API the
client checks before it sends anything."""

import re

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"

NOT_FIELDS = ("body", "query", "path", "header", "[key]")
"""The parts of the place of a refusal (pydantic's `loc`, the API's 422 `detail`) that name
no field: where in the request, and that a mapping's key is at fault (the key comes before
it: `env`, `TOWERQ_X`, `[key]`)."""


def field_of(loc: list[object] | tuple[object, ...]) -> str:
    """The dotted field a refusal's `loc` names (`env.TOWERQ_X`, `requirements.0`; empty for
    the whole)."""
    return ".".join(str(part) for part in loc if part not in NOT_FIELDS)


SHELL_INPUT_VARIABLE = "TOWERQ_SHELL_INPUT"
"""In a notebook session's new terminal (`extra_env` of JupyterLab's POST /api/terminals):
`piped` where what is typed into it is a script piped into `towerq shell`, not keys; its
shell then reads it without prompts or echo (`worker.notebook`'s TERMINAL_SHELL)."""

LOG_LINES_KEPT = 20_000
"""A job's log lines the database keeps, its newest (its `log.txt` keeps them all): the most
one answer of `/api/jobs/{id}/logs` gives (`tail`)."""
LOG_TRIMMED_HEADER = "X-Towerq-Log-Trimmed-Through"
"""On a job's log lines (`/api/jobs/{id}/logs`): the newest of its lines trimmed from the
database (its `log.txt` keeps them all), where some were."""

DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""A dataset's name: the API refuses others, and the client before it uploads a byte."""


def dataset_name_problem(name: str) -> str | None:
    """Why `name` cannot name a dataset, in words; None when it can."""
    if DATASET_NAME.match(name):
        return None
    return f"{name!r}: letters, digits, _ . -; at most 64, starting with a letter or digit"
