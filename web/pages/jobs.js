// Jobs: every job, newest first; filters in the address (shareable); live.
import { age, api, badge, count, el, gpusOf, number, percent, progress, stream } from "/lib.js";

const PAGE = 50;
const STATES = ["", "queued", "dispatched", "running", "succeeded", "failed", "cancelled"];
const POLL_MS = 2000;

export async function render(main, params) {
  const filters = { state: params.state || "", user: params.user || "", q: params.q || "", page: Number(params.page || 1) };
  const body = el("tbody");
  const status = el("p", { class: "muted", "aria-live": "polite" });
  const pager = el("nav", { class: "pager", "aria-label": "Pages" });
  let etag = null;
  let stopped = false;

  const setFilter = (key, value) => {
    const next = { ...filters, [key]: value, page: key === "page" ? value : 1 };
    const query = new URLSearchParams(Object.entries(next).filter(([, v]) => v && !(v === 1)));
    location.hash = `#/jobs${query.toString() ? `?${query}` : ""}`;
  };

  const stateSelect = el("select", { id: "filter-state", onchange: (e) => setFilter("state", e.target.value) },
    STATES.map((s) => el("option", { value: s, selected: s === filters.state }, s || "any state")));
  const userInput = el("input", { id: "filter-user", type: "search", value: filters.user, placeholder: "user", maxlength: 64 });
  const textInput = el("input", { id: "filter-text", type: "search", value: filters.q, placeholder: "name or id", maxlength: 128 });
  const form = el("form", { class: "filters", role: "search" },
    el("label", { for: "filter-state" }, "State"), stateSelect,
    el("label", { for: "filter-user" }, "User"), userInput,
    el("label", { for: "filter-text" }, "Search"), textInput,
    el("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const query = new URLSearchParams(Object.entries({ state: filters.state, user: userInput.value.trim(), q: textInput.value.trim() }).filter(([, v]) => v));
    location.hash = `#/jobs${query.toString() ? `?${query}` : ""}`;
  });

  const table = el("table", { class: "jobs" },
    el("caption", { class: "visually-hidden" }, "Jobs, newest first"),
    el("thead", {}, el("tr", {}, ["ID", "Name", "State", "User", "GPUs", "Progress", "Loss", "Accuracy", "Age", "Queue"].map((h) => el("th", { scope: "col" }, h)))),
    body);
  main.replaceChildren(el("h1", {}, "Jobs"), form, status, el("div", { class: "scroll" }, table), pager);

  async function refresh() {
    const query = new URLSearchParams({ limit: PAGE, offset: (filters.page - 1) * PAGE });
    if (filters.state) query.set("state", filters.state);
    if (filters.user) query.set("user", filters.user);
    if (filters.q) query.set("q", filters.q);
    const result = await api(`/api/jobs?${query}`, { etag: etag || "" });
    if (stopped || result.notModified) return;
    if (firstDraw) performance.mark("jobs-data");
    etag = result.etag;
    draw(result.data);
  }

  let firstDraw = true;
  function draw(page) {
    body.replaceChildren(...page.items.map(row));
    if (!page.items.length) body.replaceChildren(el("tr", {}, el("td", { colspan: 10, class: "muted" }, "No jobs match.")));
    status.textContent = `${count(page.total)} job${page.total === 1 ? "" : "s"}`;
    const pages = Math.max(1, Math.ceil(page.total / PAGE));
    pager.replaceChildren(
      el("button", { type: "button", disabled: filters.page <= 1, onclick: () => setFilter("page", filters.page - 1) }, "← Newer"),
      el("span", {}, `page ${filters.page} of ${pages}`),
      el("button", { type: "button", disabled: filters.page >= pages, onclick: () => setFilter("page", filters.page + 1) }, "Older →"),
    );
    if (firstDraw) {
      firstDraw = false;
      performance.mark("jobs-table-drawn");
      table.dataset.drawn = "1";
    }
  }

  await refresh();
  // State changes arrive at once on the list-level stream; progress (steps, loss) by a poll
  // that costs nothing when the page has not changed (ETag / 304).
  let pending = null;
  const stopStream = stream("/api/stream", {
    state: () => {
      clearTimeout(pending);
      pending = setTimeout(() => refresh().catch(() => {}), 150);
    },
  });
  const timer = setInterval(() => refresh().catch(() => {}), POLL_MS);
  return () => {
    stopped = true;
    stopStream();
    clearInterval(timer);
    clearTimeout(pending);
  };
}

function row(job) {
  const queued = job.state === "queued";
  return el("tr", { dataset: { job: job.id, state: job.state } },
    el("td", {}, el("a", { href: `#/jobs/${job.id}` }, job.id)),
    el("td", { class: "name" }, el("a", { href: `#/jobs/${job.id}` }, job.name)),
    el("td", {}, badge(job.state)),
    el("td", {}, job.user),
    el("td", { class: "mono" }, gpusOf(job), job.allocation && job.allocation.simulated ? el("span", { class: "badge sim", title: "simulated GPUs (CPU logical devices)" }, "sim") : null),
    el("td", {}, progress(job)),
    el("td", { class: "num" }, number(job.latest.loss)),
    el("td", { class: "num" }, percent(job.latest.eval_accuracy ?? job.latest.accuracy)),
    el("td", { class: "num", title: job.created_at }, age(job.created_at)),
    el("td", { class: "queue" }, queued ? [job.queue_position ? el("strong", {}, `#${job.queue_position} `) : "", job.pending_reason || "waiting for the scheduler"] : ""),
  );
}
