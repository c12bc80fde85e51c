"""The lab's calls of the client: tokens and users, GPUs, usage and fair share, groups and
reservations (`towerq.client.Client` has them; a member's jobs are in `towerq.client`).
Most of them are an admin's; a member reads the GPUs, usage, groups and reservations and
makes tokens for themselves."""

from __future__ import annotations

from typing import Any


class LabCalls:
    """The lab's routes of the API, for `Client`, which sends them (`request`)."""

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        raise NotImplementedError  # `Client.request`

    # -- tokens and users ----------------------------------------------------------------------

    def create_token(self, user: str, *, admin: bool = False, name: str = "") -> dict[str, Any]:
        """A new token for `user` (created if needed; admins for anyone, members for
        themselves): its row, with the secret (`token`) shown in this answer only."""
        return dict(self.request("POST", f"/api/users/{user}/tokens", json={"admin": admin, "name": name}))

    def tokens(self) -> list[dict[str, Any]]:
        """Your tokens (every token, for admins), never their secrets."""
        return list(self.request("GET", "/api/tokens"))

    def revoke_token(self, token_id: int) -> dict[str, Any]:
        return dict(self.request("DELETE", f"/api/tokens/{token_id}"))

    def users(self) -> list[dict[str, Any]]:
        """Every user with their limits (admins)."""
        return list(self.request("GET", "/api/users"))

    def change_user(self, name: str, **fields: Any) -> dict[str, Any]:
        """Change a user's `gpu_limit` (0: the default), `share`, `max_priority`, `is_admin`
        or `may_use_network` (admins)."""
        return dict(self.request("PATCH", f"/api/users/{name}", json=fields))

    # -- GPUs, usage and fair share -----------------------------------------------------------

    def gpus(self) -> list[dict[str, Any]]:
        """Every GPU of the lab and who holds it."""
        return list(self.request("GET", "/api/gpus"))

    def drain_gpu(self, host: str, index: int) -> list[dict[str, Any]]:
        """No new work on a GPU (admins): its jobs finish, it takes no new ones. The answer
        is the host's GPUs."""
        return list(self.request("POST", f"/api/gpus/{host}/{index}/drain"))

    def undrain_gpu(self, host: str, index: int) -> list[dict[str, Any]]:
        """Give a drained GPU back to the scheduler (admins). The answer is the host's GPUs."""
        return list(self.request("POST", f"/api/gpus/{host}/{index}/undrain"))

    def usage(self, since: str, until: str | None = None, by: str = "user") -> dict[str, Any]:
        """GPU hours, jobs and waits per user (or host, or group) between two ISO times."""
        params = {"since": since, "by": by} | ({"until": until} if until else {})
        return dict(self.request("GET", "/api/usage", params=params))

    def fair_share(self) -> dict[str, Any]:
        """Each user's (and group's) decayed usage, share and the rank term the scheduler
        gives them: `users` and `groups`."""
        return dict(self.request("GET", "/api/fair-share"))

    # -- groups and reservations --------------------------------------------------------------

    def groups(self) -> list[dict[str, Any]]:
        """Every group: share, quotas, GPU hours in the last 7 days, members."""
        return list(self.request("GET", "/api/groups"))

    def create_group(self, name: str, **fields: Any) -> dict[str, Any]:
        """A new group (admins): `share`, `max_gpus`, `max_gpu_hours_week`."""
        return dict(self.request("POST", "/api/groups", json={"name": name, **fields}))

    def change_group(self, name: str, **fields: Any) -> dict[str, Any]:
        """Change a group's share or quotas (admins); a quota given as None is taken away."""
        return dict(self.request("PATCH", f"/api/groups/{name}", json=fields))

    def delete_group(self, name: str) -> None:
        self.request("DELETE", f"/api/groups/{name}")

    def add_to_group(self, name: str, user: str, default: bool = False) -> dict[str, Any]:
        """Put a user in a group (admins); `default`: their jobs run in it when they name none."""
        return dict(self.request("PUT", f"/api/groups/{name}/members/{user}", json={"default": default}))

    def remove_from_group(self, name: str, user: str) -> dict[str, Any]:
        return dict(self.request("DELETE", f"/api/groups/{name}/members/{user}"))

    def reservations(self, include_past: bool = False) -> list[dict[str, Any]]:
        """The lab's reservations not yet over (`include_past`: every one), soonest first."""
        return list(self.request("GET", "/api/reservations", params={"all": include_past}))

    def reserve(self, group: str, gpus: int, start: str, end: str, **fields: Any) -> dict[str, Any]:
        """Keep `gpus` GPUs for `group` from `start` to `end` (ISO times with a zone; admins):
        `host`, `note`. The answer lists the jobs on them that may run past the start."""
        body = {"group": group, "gpus": gpus, "start": start, "end": end, **fields}
        return dict(self.request("POST", "/api/reservations", json=body))

    def delete_reservation(self, reservation_id: int) -> dict[str, Any]:
        return dict(self.request("DELETE", f"/api/reservations/{reservation_id}"))
