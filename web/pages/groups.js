// Groups and reservations: the lab's groups (share, quotas, GPU hours this week, members)
// and the GPUs kept for them over a window. Everyone reads them; admins change them here.
import { actionForm, api, confirmThen, dataTable, el, formInput as field, localMoment, poll, problemLine, session } from "../lib.js";

const POLL_MS = 30000;
const HOUR_MS = 3600 * 1000;

export async function render(main) {
  await session.ready;
  const admin = Boolean(session.me?.is_admin);
  const problem = problemLine();
  const groupsBox = el("div", { id: "groups" });
  const keptBox = el("div", { id: "reservations" });
  const forms = admin ? adminForms(refresh) : [];
  main.replaceChildren(
    el("h1", {}, "Groups and reservations"),
    problem,
    el(
      "p",
      { class: "muted" },
      "Fair share is two-level: groups by their shares first, then the users of each group. A group at a quota waits " +
        "until it is under it again; GPUs kept for a group are its alone over the window.",
    ),
    el("h2", {}, "Groups"),
    groupsBox,
    el("h2", {}, "Reservations"),
    keptBox,
    ...forms,
  );

  async function refresh() {
    const [groups, reservations] = await Promise.all([api("api/groups"), api("api/reservations")]);
    groupsBox.replaceChildren(el("div", { class: "scroll" }, groupsTable(groups)));
    keptBox.replaceChildren(el("div", { class: "scroll" }, reservationsTable(reservations, admin, refresh)));
    for (const select of main.querySelectorAll("select[data-groups]")) fillGroups(select, groups);
  }
  const poller = poll(refresh, POLL_MS, problem, "Refreshing groups");
  await refresh();
  return () => poller.stop();
}

function quota(value, unit) {
  return value === null ? "none" : `${value} ${unit}`;
}

function groupsTable(groups) {
  const columns = [
    { title: "Group", cell: (g) => g.name },
    { title: "Share", class: "num", cell: (g) => String(g.share) },
    { title: "GPUs at once", class: "num", cell: (g) => quota(g.max_gpus, "max") },
    {
      title: "GPU hours, last 7 days",
      class: "num",
      cell: (g) => `${g.gpu_hours_week.toFixed(1)}${g.max_gpu_hours_week === null ? "" : ` of ${g.max_gpu_hours_week}`}`,
    },
    {
      title: "Members",
      cell: (g) => g.members.map((m) => (m.default ? `${m.user} (default)` : m.user)).join(", ") || "–",
    },
  ];
  return dataTable(columns, groups, {
    caption: "groups",
    attrs: (g) => ({ dataset: { group: g.name } }),
    empty: "No groups yet: every job runs in none, and fair share is between users alone.",
  }).table;
}

function windowOf(r) {
  const from = new Date(r.start_at);
  const to = new Date(r.end_at);
  return `${from.toLocaleString()} – ${to.toLocaleString()}`;
}

function reservationsTable(reservations, admin, refresh) {
  const columns = [
    { title: "Id", class: "num", cell: (r) => String(r.id) },
    { title: "Group", cell: (r) => r.group },
    { title: "GPUs", cell: (r) => gpuList(r.gpus) },
    { title: "Window", cell: (r) => windowOf(r) },
    { title: "State", cell: (r) => (r.active ? "active" : "ahead") },
    { title: "Note", cell: (r) => r.note || "–" },
  ];
  if (admin) {
    columns.push({
      title: "",
      cell: (r) =>
        el(
          "button",
          {
            type: "button",
            class: "danger",
            "aria-label": `Delete reservation ${r.id}`,
            onclick: confirmThen(
              () => `Delete reservation ${r.id} for ${r.group}? Its GPUs become everyone's again.`,
              async () => {
                await api(`api/reservations/${r.id}`, { method: "DELETE" });
                return `Reservation ${r.id} deleted: its GPUs are everyone's again`;
              },
              `Deleting reservation ${r.id}`,
              refresh,
            ),
          },
          "Delete",
        ),
    });
  }
  return dataTable(columns, reservations, {
    caption: "reservations",
    attrs: (r) => ({ dataset: { reservation: r.id } }),
    empty: "No reservation ahead.",
  }).table;
}

// GPUs as "lab-a 0, 1, 2; lab-b 0".
function gpuList(gpus) {
  const byHost = new Map();
  for (const g of gpus) byHost.set(g.host, [...(byHost.get(g.host) || []), g.index]);
  return [...byHost].map(([host, indices]) => `${host} ${indices.join(", ")}`).join("; ");
}

function fillGroups(select, groups) {
  const chosen = select.value;
  select.replaceChildren(...groups.map((g) => el("option", { value: g.name, selected: g.name === chosen }, g.name)));
}

const number = (value) => (value === "" || value === null ? null : Number(value));

function localInput(name, offsetHours) {
  const value = localMoment(new Date(Date.now() + offsetHours * HOUR_MS));
  return el("input", { type: "datetime-local", name, value, required: true });
}

function adminForms(refresh) {
  const groupForm = actionForm(
    "New group",
    "new-group",
    [
      field("Name", el("input", { name: "name", required: true, pattern: "[a-z][a-z0-9_-]{0,63}" }), "lower-case letters, digits, - and _"),
      field("Share", el("input", { name: "share", type: "number", min: "0", step: "any", value: "1" })),
      field("GPUs at once", el("input", { name: "max_gpus", type: "number", min: "0", step: "any", placeholder: "no quota" })),
      field(
        "GPU hours per 7 days",
        el("input", { name: "max_gpu_hours_week", type: "number", min: "0", step: "any", placeholder: "no quota" }),
      ),
    ],
    "Create group",
    async (data) => {
      const body = { name: data.get("name"), share: number(data.get("share")) ?? 1 };
      for (const key of ["max_gpus", "max_gpu_hours_week"]) {
        const value = number(data.get(key));
        if (value !== null) body[key] = value;
      }
      await api("api/groups", { method: "POST", body });
      return `Group ${body.name} created`;
    },
    refresh,
  );
  const memberForm = actionForm(
    "Add a member",
    "add-member",
    [
      field("Group", el("select", { name: "group", dataset: { groups: "" } })),
      field("User", el("input", { name: "user", required: true })),
      field("Their default group", el("input", { name: "default", type: "checkbox" })),
    ],
    "Add",
    async (data) => {
      const [group, user] = [data.get("group"), data.get("user")];
      await api(`api/groups/${encodeURIComponent(group)}/members/${encodeURIComponent(user)}`, {
        method: "PUT",
        body: { default: data.get("default") === "on" },
      });
      return `${user} is in ${group}`;
    },
    refresh,
  );
  const keepForm = actionForm(
    "Keep GPUs for a group",
    "new-reservation",
    [
      field("Group", el("select", { name: "group", dataset: { groups: "" } })),
      field("GPUs", el("input", { name: "gpus", type: "number", min: "1", step: "1", value: "1" })),
      field("From", localInput("start", 1), "your local time"),
      field("To", localInput("end", 9)),
      field("Host", el("input", { name: "host", placeholder: "any" }), "keep GPUs of this host only"),
      field("Note", el("input", { name: "note", maxlength: "200", placeholder: "a deadline, a demo" })),
    ],
    "Reserve",
    async (data) => {
      const when = (name) => {
        const text = data.get(name);
        if (!text) throw new Error(`${name}: give a date and time`);
        return new Date(text).toISOString();
      };
      const body = { group: data.get("group"), gpus: number(data.get("gpus")), start: when("start"), end: when("end") };
      if (data.get("host")) body.host = data.get("host");
      if (data.get("note")) body.note = data.get("note");
      const made = await api("api/reservations", { method: "POST", body });
      const held = made.held_past_start.map((h) => `job ${h.job_id}`).join(", ");
      return `Reservation ${made.id}: ${gpuList(made.gpus)}${held ? ` (still held by ${held}, which may run past the start)` : ""}`;
    },
    refresh,
  );
  return [el("h2", {}, "Change (admins)"), el("div", { class: "admin-forms" }, groupForm, memberForm, keepForm)];
}
