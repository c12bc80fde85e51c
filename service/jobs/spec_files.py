"""The files a spec names, checked at submit: datasets and model modules inside their roots
and not in another member's uploads, a code bundle holding the module, function or program
it runs. Read, never run: no member's code runs in the API. A refusal names the field."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from service.core.exceptions import NotFoundError, SpecError
from service.core.settings import Settings
from service.jobs import sources
from service.uploads import code as code_bundles
from service.uploads import datasets
from towerq.contract.paths import PathEscapeError, resolve_inside
from towerq.contract.spec import JobSpec


def check_files(spec: JobSpec, settings: Settings, user: str) -> None:
    """Refuse paths that escape their folders or lie in another user's uploads; check that
    files exist where this host can see."""
    for field, path in (("dataset", spec.dataset_path), ("dataset_options", spec.dataset_options.test_path)):
        reason = datasets.reaches_others(path, user) if path else None
        if reason is not None:
            raise SpecError(field, reason)
    if spec.code is not None:
        _check_bundle(spec, settings)
    elif spec.model is not None and ":" in spec.model:
        module = spec.model.split(":")[0].replace(".", "/") + ".py"
        _check_inside(settings.models_path, module, "model", "TOWERQ_MODELS_PATH")
        if settings.models_path.is_dir():
            _check_function(resolve_inside(settings.models_path, module), module, spec.model)
    if spec.dataset_path is not None:
        _check_inside(settings.data_dir, spec.dataset_path, "dataset", "TOWERQ_DATA_DIR")
    if spec.dataset_options.test_path is not None:
        _check_inside(settings.data_dir, spec.dataset_options.test_path, "dataset_options", "TOWERQ_DATA_DIR")


def _check_bundle(spec: JobSpec, settings: Settings) -> None:
    """The bundle exists and holds the program a command runs or the module a model names
    (a notebook session's bundle runs nothing by itself: its member imports from it)."""
    assert spec.code is not None
    try:
        files = {entry["path"] for entry in code_bundles.manifest(settings.code_dir, spec.code)["files"]}
    except NotFoundError as err:
        raise SpecError("code", str(err)) from None
    if spec.command is not None:
        _check_program(spec.command[0], files, spec.code)
        return
    if spec.is_notebook:
        return
    assert spec.model is not None
    module = spec.model.split(":")[0].replace(".", "/")
    found = next((path for path in (f"{module}.py", f"{module}/__init__.py") if path in files), None)
    if found is None:
        shown = ", ".join(sorted(path for path in files if path.endswith(".py"))[:10])
        raise SpecError("model", f"bundle {spec.code[:12]}… has no {module}.py (its Python files: {shown or 'none'})")
    _check_function(code_bundles.bundle_file(settings.code_dir, spec.code, found), found, spec.model)


def _check_function(path: Path, shown: str, model: str) -> None:
    """The module at `path` (`shown` in messages) defines the function `model` names, as far
    as reading it tells (`service.jobs.sources`)."""
    try:
        if path.stat().st_size > sources.MAX_SOURCE_BYTES:
            return
        source = path.read_text(errors="replace")
    except OSError:
        return  # the trainer will say what it cannot read
    if reason := sources.missing_function(source, model.partition(":")[2], shown):
        raise SpecError("model", reason)


def _check_program(program: str, files: set[str], code: str) -> None:
    """A command's program is a file of its bundle (a path: `./run.sh`, `bin/train`) or a
    program on the sandbox's PATH (a name: `python`, `bash`), the lab's Python first."""
    if program.startswith("/"):  # the host's system folders, which the sandbox shows
        if not Path(program).is_file():
            raise SpecError("command", f"no program {program!r} on this host")
        return
    if "/" in program:
        if program.removeprefix("./") not in files:
            raise SpecError(
                "command", f"{program!r} is not a file of bundle {code[:12]}… (name a file in it, or a program on PATH)"
            )
        return
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH") or os.defpath])
    if shutil.which(program, path=path) is None:
        hint = f" (a file of the bundle: run it as ./{program}, or python {program})" if program in files else ""
        raise SpecError("command", f"no program {program!r} on the workers' PATH{hint}")


def _check_inside(root: Path, relative: str, field: str, setting: str) -> None:
    try:
        resolved = resolve_inside(root, relative.split("*")[0] or ".")
    except PathEscapeError as err:
        raise SpecError(field, str(err)) from None
    if root.is_dir() and "*" not in relative and not resolved.exists():
        raise SpecError(field, f"{relative!r} not found under {setting} ({root})")
