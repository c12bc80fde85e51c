// Tokens and users: your API tokens (how the command line, the Python client and scripts act
// as you: make one, revoke one), and for admins every token, every user and their limits.
import { actionForm, api, confirmThen, dataTable, el, formInput as field, poll, problemLine, session, when } from "../lib.js";

const POLL_MS = 30000;

export async function render(main) {
  await session.ready;
  const me = session.me;
  const admin = Boolean(me?.is_admin);
  const problem = problemLine();
  const secret = el("div", { id: "new-secret", "aria-live": "polite" });
  const tokensBox = el("div", { id: "tokens" });
  const usersBox = el("div", { id: "users" });
  const forms = [tokenForm(me, admin, secret, refresh)];
  if (admin) forms.push(userForm(refresh));
  main.replaceChildren(
    el("h1", {}, admin ? "Tokens and users" : "Your tokens"),
    problem,
    el(
      "p",
      { class: "muted" },
      "A token is how the command line (",
      el("code", {}, "towerq login URL --token TOKEN"),
      "), the Python client and your scripts act as you. Make one for each place that needs one; revoke it " +
        "when it is done with, or lost: it stops working at once.",
    ),
    secret,
    el("h2", {}, admin ? "Tokens" : "Your tokens"),
    tokensBox,
    ...(admin ? [el("h2", {}, "Users"), usersBox] : []),
    el("h2", {}, "Change"),
    el("div", { class: "admin-forms" }, ...forms),
  );

  async function refresh() {
    const [tokens, users] = await Promise.all([api("api/tokens"), admin ? api("api/users") : Promise.resolve([])]);
    tokensBox.replaceChildren(el("div", { class: "scroll" }, tokensTable(tokens, admin, refresh)));
    if (admin) usersBox.replaceChildren(el("div", { class: "scroll" }, usersTable(users)));
  }
  const poller = poll(refresh, POLL_MS, problem, "Refreshing tokens");
  await refresh();
  return () => poller.stop();
}

function tokensTable(tokens, admin, refresh) {
  const columns = [
    { title: "Id", class: "num", cell: (t) => String(t.id) },
    ...(admin ? [{ title: "User", cell: (t) => t.user }] : []),
    { title: "Label", cell: (t) => t.name || "–" },
    { title: "Starts with", cell: (t) => el("code", {}, `${t.prefix}…`) },
    { title: "Created", cell: (t) => when(t.created_at) },
    { title: "Last used", cell: (t) => (t.last_used_at ? when(t.last_used_at) : "never") },
    {
      title: "State",
      cell: (t) => (t.revoked_at ? `revoked ${when(t.revoked_at)}` : t.id === session.me?.token_id ? "active (this browser)" : "active"),
    },
    { title: "", cell: (t) => (t.revoked_at ? "" : revokeButton(t, refresh)) },
  ];
  return dataTable(columns, tokens, {
    caption: "tokens",
    attrs: (t) => ({ dataset: { token: t.id, state: t.revoked_at ? "revoked" : "active" } }),
    empty: "No token yet.",
  }).table;
}

function revokeButton(token, refresh) {
  const whose = token.name ? `"${token.name}"` : `${token.prefix}…`;
  const mine = () => token.id === session.me?.token_id;
  return el(
    "button",
    {
      type: "button",
      class: "danger",
      "aria-label": `Revoke token ${token.id}`,
      onclick: confirmThen(
        () => {
          const out = mine() ? " This browser is logged in with it: you will be logged out." : "";
          return `Revoke token ${token.id} (${whose}) of ${token.user}? What uses it stops working at once.${out}`;
        },
        async () => {
          await api(`api/tokens/${token.id}`, { method: "DELETE" });
          return mine() ? null : `Token ${token.id} revoked`;
        },
        `Revoking token ${token.id}`,
        () => (mine() ? location.reload() : refresh()), // its session is gone: the login form
      ),
    },
    "Revoke",
  );
}

function usersTable(users) {
  const columns = [
    { title: "User", cell: (u) => u.name },
    { title: "Admin", cell: (u) => (u.is_admin ? "yes" : "no") },
    { title: "GPUs at once", class: "num", cell: (u) => (u.gpu_limit === null ? "lab default" : String(u.gpu_limit)) },
    { title: "Share", class: "num", cell: (u) => String(u.share) },
    { title: "Highest priority", cell: (u) => u.max_priority },
    { title: "Network", cell: (u) => (u.may_use_network ? "may ask" : "no") },
    { title: "Tokens", class: "num", cell: (u) => String(u.tokens) },
  ];
  return dataTable(columns, users, { caption: "users", attrs: (u) => ({ dataset: { user: u.name } }) }).table;
}

// A new token: yours (a member's), or anyone's (an admin's, which makes the user if needed).
// Its secret is shown once, here, with how to use it.
function tokenForm(me, admin, secret, refresh) {
  const user = el("input", { name: "user", required: true, value: me?.user ?? "", readonly: !admin });
  const fields = [
    field("User", user, admin ? "a new name makes the user" : "a token of your own"),
    field("Label", el("input", { name: "name", maxlength: "64", placeholder: "laptop, CI, a notebook" })),
  ];
  if (admin) fields.push(field("An admin's token", el("input", { name: "admin", type: "checkbox" }), "makes the user an admin"));
  return actionForm(
    "New token",
    "new-token",
    fields,
    "Create token",
    async (data) => {
      const who = data.get("user");
      const body = { name: data.get("name") || "", admin: data.get("admin") === "on" };
      const made = await api(`api/users/${encodeURIComponent(who)}/tokens`, { method: "POST", body });
      secret.replaceChildren(
        el(
          "div",
          { class: "card secret" },
          el("p", {}, `Token ${made.id} for ${made.user}: store it now, it is not shown again.`),
          el("code", { class: "token" }, made.token),
          el("p", { class: "muted" }, "On the command line: ", el("code", {}, `towerq login ${apiBase()} --token ${made.token}`)),
        ),
      );
      return `Token ${made.id} created for ${made.user}`;
    },
    refresh,
  );
}

// The API's address as this page reaches it (a path prefix behind a proxy included).
function apiBase() {
  return (location.origin + location.pathname).replace(/\/(index\.html)?$/, "");
}

// A user's limits (admins): only the fields given change.
function userForm(refresh) {
  const choice = (name, options) =>
    el("select", { name }, el("option", { value: "" }, "unchanged"), ...options.map(([value, label]) => el("option", { value }, label)));
  return actionForm(
    "A user's limits",
    "user-limits",
    [
      field("User", el("input", { name: "user", required: true })),
      field(
        "GPUs at once",
        el("input", { name: "gpu_limit", type: "number", min: "0", step: "1", placeholder: "unchanged" }),
        "0: the lab's default",
      ),
      field("Share", el("input", { name: "share", type: "number", min: "0", step: "any", placeholder: "unchanged" }), "fair-share weight"),
      field(
        "Highest priority",
        choice("max_priority", [
          ["high", "high"],
          ["normal", "normal"],
          ["low", "low"],
        ]),
      ),
      field(
        "Admin",
        choice("is_admin", [
          ["true", "yes"],
          ["false", "no"],
        ]),
      ),
      field(
        "Network",
        choice("may_use_network", [
          ["true", "may ask"],
          ["false", "no"],
        ]),
      ),
    ],
    "Change",
    async (data) => {
      const who = data.get("user");
      const body = {};
      for (const key of ["gpu_limit", "share"]) if (data.get(key) !== "") body[key] = Number(data.get(key));
      if (data.get("max_priority")) body.max_priority = data.get("max_priority");
      for (const key of ["is_admin", "may_use_network"]) if (data.get(key)) body[key] = data.get(key) === "true";
      await api(`api/users/${encodeURIComponent(who)}`, { method: "PATCH", body });
      return `${who}'s limits changed`;
    },
    refresh,
  );
}
