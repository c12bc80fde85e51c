// towerq dashboard: a small single-page app over the REST API (no build step).
// Pages live in /pages/*.js; each exports `render(main, params)` and may return a
// function that stops what it started (streams, timers) when the user leaves the page.

import { ApiError, api, el, session, toast } from "./lib.js";

const pages = {
  jobs: () => import("./pages/jobs.js"),
  job: () => import("./pages/job.js"),
  gpus: () => import("./pages/gpus.js"),
  submit: () => import("./pages/submit.js"),
  compare: () => import("./pages/compare.js"),
  sweeps: () => import("./pages/sweeps.js"),
  sweep: () => import("./pages/sweep.js"),
  usage: () => import("./pages/usage.js"),
  groups: () => import("./pages/groups.js"),
  tokens: () => import("./pages/tokens.js"),
};

let leave = null;
let shown = 0; // which navigation is current: a slow page must not draw over a newer one

function route() {
  const hash = location.hash.replace(/^#\/?/, "") || "jobs";
  const [path, query = ""] = hash.split("?");
  const parts = path.split("/").filter(Boolean);
  const params = Object.fromEntries(new URLSearchParams(query));
  if (parts[0] === "jobs" && parts[1]) return { page: "job", params: { ...params, id: parts[1] } };
  if (parts[0] === "sweeps" && parts[1]) return { page: "sweep", params: { ...params, id: parts[1] } };
  return { page: pages[parts[0]] ? parts[0] : "jobs", params };
}

async function show() {
  if (leave) {
    leave();
    leave = null;
  }
  const { page, params } = route();
  document.querySelectorAll("[data-nav]").forEach((a) => {
    const parent = { job: "jobs", sweep: "sweeps" }[page];
    a.toggleAttribute("aria-current", a.dataset.nav === page || a.dataset.nav === parent);
  });
  const visit = ++shown;
  const main = document.getElementById("main");
  const box = el("div", { class: "page" }, el("p", { class: "muted" }, "Loading…"));
  main.replaceChildren(box);
  try {
    const module = await pages[page]();
    if (visit !== shown) return;
    const stop = (await module.render(box, params)) || null;
    if (visit !== shown) {
      if (stop) stop();
      return;
    }
    leave = stop;
  } catch (error) {
    if (visit !== shown) return;
    if (error instanceof ApiError && error.status === 401) {
      showLogin(main);
    } else {
      main.replaceChildren(el("p", { class: "error", role: "alert" }, `Could not show this page: ${error.message}`));
    }
  }
}

function showLogin(main, message = "") {
  const input = el("input", { id: "token", type: "password", autocomplete: "off", required: true });
  const form = el(
    "form",
    { class: "login card" },
    el("h1", {}, "Log in"),
    el("p", {}, "Paste an API token (", el("code", {}, "towerq token create --user NAME"), ")."),
    el("label", { for: "token" }, "API token"),
    input,
    el("p", { class: "error", id: "login-error", "aria-live": "polite" }, message),
    el("button", { type: "submit" }, "Log in"),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (await login(input.value.trim())) {
      await whoami();
      show();
    } else {
      form.querySelector("#login-error").textContent = "That token was refused.";
    }
  });
  main.replaceChildren(form);
  input.focus();
}

async function login(token) {
  const response = await fetch("api/session", { method: "POST", headers: { Authorization: `Bearer ${token}` } });
  return response.ok;
}

async function whoami() {
  try {
    session.me = await api("api/me");
    const me = session.me;
    document.getElementById("who").textContent = `${me.user}${me.is_admin ? " (admin)" : ""}`;
    document.getElementById("logout").hidden = false;
  } catch (error) {
    session.me = null;
    if (!(error instanceof ApiError && error.status === 401)) toast(`Could not reach the API: ${error.message}`);
  }
}

document.getElementById("logout").addEventListener("click", async () => {
  await fetch("api/session", { method: "DELETE" });
  session.me = null;
  document.getElementById("who").textContent = "";
  document.getElementById("logout").hidden = true;
  showLogin(document.getElementById("main"));
});

async function start() {
  performance.mark("app-start");
  // A login link (`towerq up` prints one) carries the token once, in the fragment (`#token=`),
  // which no browser sends to a server or in a Referer; the session keeps it in an HttpOnly
  // cookie and the address bar forgets it. (`?token=` links of older versions still work.)
  const query = new URLSearchParams(location.search);
  const fragment = location.hash.startsWith("#token=") ? decodeURIComponent(location.hash.slice(7)) : null;
  const token = fragment ?? query.get("token");
  if (token) {
    const ok = await login(token);
    history.replaceState(null, "", location.pathname + (fragment ? "#/" : location.hash));
    if (!ok) toast("The token in the link was refused.");
  }
  // Who we are is asked while the first page loads; pages that need it await it.
  session.ready = whoami();
  window.addEventListener("hashchange", show);
  show();
}

start();
