"""Which hold a worker keeps on a job folder's size (`TOWERQ_JOB_DISK`): `image`, a disk
image of its own while an attempt runs (`worker.disk`), or `measure` (`worker.folder`);
`auto`, the default, images where they work.

Images need a root worker (loop devices, mounts) and `mkfs.ext4`. `auto` uses them where
that works and the measure elsewhere (a worker that is not root, a container without loop
devices, network storage), and says which in the worker's log; a worker set to `image`
where it cannot work refuses to start and says why (`images_work`). `auto` keeps the
measure where the artifacts folder is network storage (`network_storage`): there an API on
another host reads a running job's folder, which an image would hide, and a dead host's
image would hold back the checkpoints the job's next attempt elsewhere resumes from.

The probe (`images_work`) mounts an image of its own in `TOWERQ_VAR_DIR`; a worker killed
meanwhile would leave it mounted there. Probes take turns under one lock in that folder
(workers may share it), and each first unmounts and removes what earlier ones left.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import shutil
import tempfile
from pathlib import Path

from service.core.settings import Settings
from worker.disk_image import (
    MIN_IMAGE_BYTES,
    MIN_INODES,
    MOUNT_OPTIONS,
    DiskError,
    make_image,
    mounted_at,
    unmount,
)
from worker.mountinfo import MOUNTINFO, beneath, holding

DISK_KINDS = ("auto", "image", "measure")
PROBE_PREFIX = ".disk-probe-"
PROBE_LOCK = ".disk-probe.lock"
"""Held by the probe that runs (an flock): while it is, no other probe's folder is in use."""

log = logging.getLogger(__name__)


@functools.cache
def images_work(var_dir: Path) -> str | None:
    """None when this worker can put a job's folder on an image of its own, else why not."""
    if os.geteuid() != 0:
        return "it needs a worker that is root (loop devices and mounts)"
    if shutil.which("mkfs.ext4") is None:
        return "mkfs.ext4 is not installed (apt install e2fsprogs)"
    var_dir = var_dir.resolve()
    var_dir.mkdir(parents=True, exist_ok=True)
    lock = os.open(var_dir / PROBE_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        clear_left_probes(var_dir)
        with tempfile.TemporaryDirectory(dir=var_dir, prefix=PROBE_PREFIX) as name:
            probe = Path(name)
            try:
                make_image(probe / "probe.img", MIN_IMAGE_BYTES, MIN_INODES)
                with mounted_at(probe / "probe.img", probe / "mounted", MOUNT_OPTIONS):
                    pass
            except DiskError as err:
                return f"a loop-mounted image does not work here ({err})"
    finally:
        os.close(lock)
    return None


def clear_left_probes(var_dir: Path) -> None:
    """Unmount (deepest first) and remove the probe folders of `var_dir`: the caller holds
    `PROBE_LOCK`, so each is one a killed worker left. A folder that is a mount point itself
    (no probe's) or has a mount inside that will not go stays (removing its files would
    empty what is mounted, not the folder)."""
    for folder in sorted(var_dir.glob(f"{PROBE_PREFIX}*")):
        if folder.is_symlink() or not folder.is_dir() or os.path.ismount(folder):
            continue
        points = beneath(folder)
        try:
            for point in points:
                unmount(point)
        except DiskError as err:
            log.warning("a disk probe's folder a killed worker left stays: %s", err)
            continue
        shutil.rmtree(folder, ignore_errors=True)
        log.info("removed a disk probe's folder a killed worker left%s: %s", " mounted" if points else "", folder)


def check(kind: str, var_dir: Path) -> None:
    """DiskError when `TOWERQ_JOB_DISK` is `kind` and this worker cannot do it (it refuses
    to start, as for a missing sandbox)."""
    if kind not in DISK_KINDS:
        raise DiskError(f"TOWERQ_JOB_DISK is {kind!r}: use {', '.join(DISK_KINDS)}")
    if kind == "image" and (why := images_work(var_dir.resolve())) is not None:
        raise DiskError(f"TOWERQ_JOB_DISK=image: {why}; or set TOWERQ_JOB_DISK=measure")


NETWORK_FILESYSTEMS = frozenset(
    ("nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "gpfs", "beegfs", "afs", "9p")
)
"""Filesystems other hosts may write (and any FUSE one: sshfs, s3fs, JuiceFS...)."""


def network_storage(path: Path, mountinfo: Path = MOUNTINFO) -> str | None:
    """The type of `path`'s filesystem where it is network storage (`NETWORK_FILESYSTEMS`),
    read from the mount that holds it in `mountinfo`; else None."""
    holder = holding(path, mountinfo)
    kind = holder.kind if holder is not None else ""
    return kind if kind in NETWORK_FILESYSTEMS or kind.startswith("fuse") else None


def in_use(settings: Settings) -> bool:
    """Whether this worker puts job folders on images: `image` (checked at its start),
    `auto` where it can (a root worker that mounts a loop image, artifacts not on network
    storage), never with `measure`."""
    if settings.job_disk == "measure":
        return False
    return settings.job_disk == "image" or _auto_refused(settings) is None


def _auto_refused(settings: Settings) -> str | None:
    if (why := images_work(settings.var_dir.resolve())) is not None:
        return why
    if (kind := network_storage(settings.artifacts_dir)) is not None:
        return f"the artifacts folder is network storage ({kind}), which an image would hide from other hosts"
    return None


def described(settings: Settings) -> str:
    """What holds a job folder's limit on this worker, in words for its log."""
    if in_use(settings):
        said = "job folders are disk images of TOWERQ_JOB_FOLDER_MAX_BYTES while attempts run (TOWERQ_JOB_DISK)"
        if (kind := network_storage(settings.artifacts_dir)) is not None:
            said += f"; the artifacts folder is network storage ({kind}): other hosts do not see a running job's folder"
        return said
    why = "" if settings.job_disk == "measure" else f": {_auto_refused(settings)}"
    return f"job folders are measured, not disk images (TOWERQ_JOB_DISK={settings.job_disk}{why})"
