"""Groups: parts of the lab (sub-groups, projects) that share its GPUs by agreement.

An admin creates a group with a share and optional quotas (GPUs at once, GPU hours in any
7 days) and puts users in it; a user may belong to several, one of them their default. A
job runs in the group its spec names (the owner must belong to it) or its owner's default
group; the scheduler ranks groups by their shares first, then the users of each group
(`service.scheduler.ranking`), and holds back a group's jobs while it is over a quota.
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, selectinload

from service.core.exceptions import NotFoundError, SpecError, StateConflictError
from service.core.models import FINAL_STATES, Group, GroupMember, Job, User, utcnow
from service.lab.auth import Caller
from service.lab.reservations import open_reservations


def resolve_group(session: Session, caller: Caller, named: str | None) -> str | None:
    """The group a new job of `caller` runs in: the one named (which must exist, and the
    caller belong to, unless an admin), else their default group, else their only group,
    else none."""
    if named is not None:
        group = session.scalars(select(Group).where(Group.name == named)).one_or_none()
        if group is None:
            raise SpecError("group", f"there is no group {named!r} (towerq group list shows them)")
        if not caller.is_admin and not any(m.user_id == caller.user_id for m in group.members):
            raise SpecError("group", f"you are not a member of {named!r}; an admin adds you with towerq group add")
        return named
    return default_groups(session, caller.user_id).get(caller.name)


def default_groups(session: Session, user_id: int | None = None) -> dict[str, str]:
    """The group of a job that names none, by user name (of `user_id` alone, when given):
    their default group, else their only one; a member of several with no default has none."""
    query = (
        select(User.name, Group.name, GroupMember.is_default)
        .join(GroupMember, GroupMember.user_id == User.id)
        .join(Group, Group.id == GroupMember.group_id)
        .order_by(Group.name)
    )
    if user_id is not None:
        query = query.where(User.id == user_id)
    chosen: dict[str, str] = {}
    groups: dict[str, list[str]] = defaultdict(list)
    for user, group, is_default in session.execute(query):
        groups[user].append(group)
        if is_default:
            chosen.setdefault(user, group)
    return {**{user: names[0] for user, names in groups.items() if len(names) == 1}, **chosen}


def get_group(session: Session, name: str) -> Group:
    group = session.scalars(
        select(Group).where(Group.name == name).options(selectinload(Group.members).selectinload(GroupMember.user))
    ).one_or_none()
    if group is None:
        raise NotFoundError(f"no group {name!r}")
    return group


def all_groups(session: Session) -> list[Group]:
    query = select(Group).options(selectinload(Group.members).selectinload(GroupMember.user)).order_by(Group.name)
    return list(session.scalars(query).all())


def create_group(
    session: Session, name: str, share: float, max_gpus: float | None, max_gpu_hours_week: float | None
) -> Group:
    if session.scalars(select(Group.id).where(Group.name == name)).first() is not None:
        raise StateConflictError(f"group {name!r} exists already: change it with towerq group set")
    group = Group(name=name, share=share, max_gpus=max_gpus, max_gpu_hours_week=max_gpu_hours_week)
    session.add(group)
    session.flush()
    return get_group(session, name)


def delete_group(session: Session, name: str) -> None:
    """Refused while any of its jobs waits or runs: they would lose their share and quotas."""
    group = get_group(session, name)
    active = session.scalar(
        select(func.count()).select_from(Job).where(Job.group == name, Job.state.not_in(tuple(FINAL_STATES)))
    )
    kept = open_reservations(session, name, utcnow())
    if kept:
        listed = ", ".join(str(i) for i in kept)
        raise StateConflictError(f"group {name!r} has reservations not yet over ({listed}): delete them first")
    if active:
        raise StateConflictError(
            f"group {name!r} has {active} jobs waiting or running: cancel them or let them end first"
        )
    session.delete(group)


def add_member(session: Session, name: str, user_name: str, default: bool) -> Group:
    group = get_group(session, name)
    user = session.scalars(select(User).where(User.name == user_name)).one_or_none()
    if user is None:
        raise NotFoundError(f"no user {user_name!r}")
    member = next((m for m in group.members if m.user_id == user.id), None)
    if member is None:
        member = GroupMember(group=group, user=user, is_default=False)
        session.add(member)
    if default:
        session.execute(update(GroupMember).where(GroupMember.user_id == user.id).values(is_default=False))
        member.is_default = True
    session.flush()
    session.expire(group)
    return get_group(session, name)


def remove_member(session: Session, name: str, user_name: str) -> Group:
    group = get_group(session, name)
    member = next((m for m in group.members if m.user.name == user_name), None)
    if member is None:
        raise NotFoundError(f"{user_name!r} is not a member of {name!r}")
    session.delete(member)
    session.flush()
    session.expire(group)
    return get_group(session, name)
