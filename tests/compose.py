"""Read docker-compose.yml and the Dockerfile as Docker would, for tests on a machine
without a container engine: compose's variable interpolation (`${VAR}`, `${VAR:-default}`,
`${VAR-default}`, `${VAR:?error}`, nested defaults, `$$`), YAML anchors and merge keys, and
the Dockerfile's stages with their instructions."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.stack import REPO

COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
ENV_EXAMPLE = REPO / ".env.example"
TOWERQ_SERVICES = ("migrate", "bootstrap", "api", "scheduler", "worker")
ONE_SHOTS = ("migrate", "bootstrap")
SPEC = {"model": "mlp", "dataset": "digits", "gpu_count": 1, "hyperparameters": {"steps": 40}}
"""A job the deployment runs end to end."""
EXPRESSION = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])(.*))?$", re.S)


class InterpolationError(ValueError):
    """A `${VAR:?message}` whose variable is unset: compose refuses the whole file."""


def interpolate(text: str, env: dict[str, str]) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("${", i):
            depth, j = 1, i + 2
            while depth:
                if j >= len(text):
                    raise ValueError(f"unclosed ${{ in {text!r}")
                if text.startswith("${", j):
                    depth, j = depth + 1, j + 2
                else:
                    depth, j = depth - (text[j] == "}"), j + 1
            match = EXPRESSION.match(text[i + 2 : j - 1])
            if match is None:
                raise ValueError(f"bad expression {text[i:j]!r}")
            name, operator, argument = match.groups()
            value = env.get(name)
            unset = value is None or (operator is not None and operator.startswith(":") and value == "")
            if operator in (":-", "-") and unset:
                value = interpolate(argument, env)
            elif operator in (":?", "?") and unset:
                raise InterpolationError(f"{name}: {interpolate(argument, env)}")
            out.append(value or "")
            i = j
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def variables(text: str) -> set[str]:
    """Every variable the file reads (`$$` escapes, seen by the containers, are not)."""
    return set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)", text))


def _walk(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_walk(item, env) for item in node]
    if isinstance(node, dict):
        return {key: _walk(value, env) for key, value in node.items()}
    return node


def load_compose(env: dict[str, str], path: Path = COMPOSE) -> dict[str, Any]:
    """The compose file as `docker compose config` would see it with `env` as its `.env`."""
    return _walk(yaml.safe_load(path.read_text()), env)


def read_env_file(path: Path = ENV_EXAMPLE) -> tuple[dict[str, str], set[str]]:
    """The variables a `.env` sets, and those it mentions in comments (optional ones)."""
    values: dict[str, str] = {}
    mentioned: set[str] = set()
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("#"):
            mentioned.update(re.findall(r"\b([A-Z][A-Z0-9_]+)=", line))
        elif line:
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values, mentioned


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def of(self, keyword: str) -> list[str]:
        return [argument for instruction, argument in self.instructions if instruction == keyword]

    def exec_form(self, keyword: str) -> list[str]:
        """The JSON array of the stage's one `keyword` instruction (CMD, or HEALTHCHECK's CMD)."""
        (argument,) = self.of(keyword)
        if keyword == "HEALTHCHECK":
            argument = argument[argument.index("CMD ") + 4 :]
        return json.loads(argument)


def dockerfile_stages(path: Path = DOCKERFILE) -> dict[str, Stage]:
    """Stages by name, with their instructions (continuation lines joined, comments dropped)."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line in logical:
        instruction, _, argument = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            base, _, name = argument.partition(" AS ")
            current = Stage(name=name.strip(), base=base.strip())
            stages[current.name] = current
        elif current is not None:
            current.instructions.append((instruction, argument.strip()))
    return stages


def example_compose(**env: str) -> dict:
    values, _ = read_env_file()
    return load_compose({**values, **env})


def seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(duration[:-1]) * units[duration[-1]]
