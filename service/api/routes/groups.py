"""Groups: admins create them with a share and quotas and put users in them; everyone reads
them (a member picks one per job with the spec's `group`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import BaseModel, Field

from service.api.deps import AdminDep, CallerDep, DatabaseDep, SessionDep
from service.core.models import Group, utcnow
from service.core.schemas.lab import GroupOut, MemberOut
from service.lab import groups as lab_groups
from service.lab.auth import USER_NAME_PATTERN
from service.scheduler.snapshot import group_gpu_hours
from towerq.contract.spec import GROUP_NAME_PATTERN

router = APIRouter(prefix="/api", tags=["groups"])

GroupPath = Annotated[str, Path(pattern=GROUP_NAME_PATTERN, description="group name")]
UserPath = Annotated[str, Path(pattern=USER_NAME_PATTERN, description="user name")]
Share = Annotated[float, Field(gt=0, le=1_000_000, description="its weight against the other groups")]
MaxGpus = Annotated[float, Field(gt=0, le=100_000, description="at most this many GPUs at once")]
MaxHours = Annotated[float, Field(gt=0, le=10_000_000, description="at most this many GPU hours in any 7 days")]


class GroupCreate(BaseModel):
    model_config = {"extra": "forbid"}

    name: str = Field(pattern=GROUP_NAME_PATTERN, description="lower-case letters, digits, - and _")
    share: Share = 1.0
    max_gpus: MaxGpus | None = None
    max_gpu_hours_week: MaxHours | None = None


class GroupChange(BaseModel):
    """Only the fields given change; `null` takes a quota away."""

    model_config = {"extra": "forbid"}

    share: Share | None = None
    max_gpus: MaxGpus | None = None
    max_gpu_hours_week: MaxHours | None = None


class MemberChange(BaseModel):
    model_config = {"extra": "forbid"}

    default: bool = Field(default=False, description="make this the user's default group")


def group_out(group: Group, hours: dict[str, float]) -> GroupOut:
    members = [MemberOut(user=m.user.name, default=m.is_default) for m in group.members]
    return GroupOut(
        name=group.name,
        share=group.share,
        max_gpus=group.max_gpus,
        max_gpu_hours_week=group.max_gpu_hours_week,
        gpu_hours_week=hours.get(group.name, 0.0),
        members=sorted(members, key=lambda m: m.user),
        created_at=group.created_at,
    )


@router.get("/groups", response_model=list[GroupOut])
def groups(session: SessionDep, _: CallerDep) -> list[GroupOut]:
    """Every group: share, quotas, GPU hours in the last 7 days, members."""
    hours = group_gpu_hours(session, utcnow())
    return [group_out(group, hours) for group in lab_groups.all_groups(session)]


@router.get("/groups/{name}", response_model=GroupOut)
def group(name: GroupPath, session: SessionDep, _: CallerDep) -> GroupOut:
    return group_out(lab_groups.get_group(session, name), group_gpu_hours(session, utcnow(), {name}))


@router.post("/groups", status_code=201, response_model=GroupOut)
def create_group(body: GroupCreate, db: DatabaseDep, _: AdminDep) -> GroupOut:
    """A new group (admins)."""
    with db.write() as session:
        made = lab_groups.create_group(session, body.name, body.share, body.max_gpus, body.max_gpu_hours_week)
        return group_out(made, {})


@router.patch("/groups/{name}", response_model=GroupOut)
def change_group(name: GroupPath, change: GroupChange, db: DatabaseDep, _: AdminDep) -> GroupOut:
    """Change a group's share or quotas (admins); the next scheduling pass applies them."""
    with db.write() as session:
        found = lab_groups.get_group(session, name)
        for field in change.model_fields_set:
            value = getattr(change, field)
            if field == "share" and value is None:
                continue  # a share cannot be taken away, only changed
            setattr(found, field, value)
        session.flush()
        return group_out(found, group_gpu_hours(session, utcnow(), {name}))


@router.delete("/groups/{name}", status_code=204)
def delete_group(name: GroupPath, db: DatabaseDep, _: AdminDep) -> None:
    """Delete a group none of whose jobs waits or runs (admins); usage by group keeps its name."""
    with db.write() as session:
        lab_groups.delete_group(session, name)


@router.put("/groups/{name}/members/{user}", response_model=GroupOut)
def add_member(name: GroupPath, user: UserPath, body: MemberChange, db: DatabaseDep, _: AdminDep) -> GroupOut:
    """Put a user in a group, or make it their default (admins)."""
    with db.write() as session:
        return group_out(lab_groups.add_member(session, name, user, body.default), {})


@router.delete("/groups/{name}/members/{user}", response_model=GroupOut)
def remove_member(name: GroupPath, user: UserPath, db: DatabaseDep, _: AdminDep) -> GroupOut:
    """Take a user out of a group (admins); their jobs already in it keep it."""
    with db.write() as session:
        return group_out(lab_groups.remove_member(session, name, user), {})
