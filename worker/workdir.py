"""`python -m worker.workdir BUNDLE WORK -- COMMAND...`: a command job's working folder, then
its command there.

A program writes where it runs: TensorBoard's `runs/`, Lightning's `lightning_logs/`,
Hydra's `outputs/`, a `checkpoints/` of its own. Its code bundle is read only (shared by
every job that sent the same files), so the program starts in WORK, a copy of the bundle in
the job's folder (`work/`): what it writes there is kept with the job's artifacts and found
again by its next attempt, as in a Slurm job's folder. Each attempt copies the bundle's
files again over what is there (its code as sent; the rest kept).

It runs as the program runs, in its sandbox as its user, before anything of the program:
what an earlier attempt left in WORK (a link where a file of the bundle goes) is the
program's own, and the copy can reach nothing the program could not. Standard library only.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import sys
from pathlib import Path

NOT_RUN = 127
"""The exit code of a command that could not be run (a shell's)."""
HINTS = {
    errno.ENOENT: " (no such file in the job's code, nor a program on the worker's PATH)",
    errno.EACCES: " (a file of the job's code runs only if packed executable: `bash run.sh` always works)",
}


def copy_bundle(bundle: Path, work: Path) -> None:
    """The bundle's folders and files into `work`, over what is there of the same names (a
    file, folder or link where the bundle has another kind is replaced); the rest is kept.
    A link in WORK's place is not followed (the worker refuses it before, `prepare_folders`)."""
    if work.is_symlink():
        raise SystemExit(f"towerq: {work} is a link, not the job's working folder")
    work.mkdir(exist_ok=True)
    for folder, subfolders, files in os.walk(bundle):
        into = work / Path(folder).relative_to(bundle)
        for name in subfolders:
            target = into / name
            if target.is_symlink() or (target.exists() and not target.is_dir()):
                target.unlink()
            target.mkdir(exist_ok=True)
        for name in files:
            target = into / name
            if target.is_symlink() or target.is_file():
                target.unlink()
            elif target.exists():
                shutil.rmtree(target)
            shutil.copyfile(Path(folder) / name, target, follow_symlinks=False)
            os.chmod(target, stat.S_IMODE(os.stat(Path(folder) / name).st_mode) | stat.S_IWUSR)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m worker.workdir BUNDLE WORK -- COMMAND...", file=sys.stderr)
        return 2
    bundle, work, command = Path(argv[0]), Path(argv[1]), argv[3:]
    copy_bundle(bundle, work)
    os.chdir(work)
    try:
        os.execvp(command[0], command)
    except OSError as err:
        hint = HINTS.get(err.errno or 0, "")
        print(f"towerq: cannot run {command[0]!r}: {err.strerror}{hint}", file=sys.stderr)
    return NOT_RUN


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
