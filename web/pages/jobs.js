// Jobs: every job, newest first; filters in the address (shareable); live.
import {
  age,
  api,
  badge,
  count,
  dataTable,
  el,
  expectedStart,
  gpusOf,
  number,
  percent,
  poll,
  problemLine,
  progress,
  stream,
} from "../lib.js";

const PAGE = 50;
const STATES = ["", "queued", "dispatched", "running", "succeeded", "failed", "cancelled"];
const POLL_MS = 2000;

export async function render(main, params) {
  const filters = { state: params.state || "", user: params.user || "", q: params.q || "", page: Number(params.page || 1) };
  const status = el("p", { class: "muted", "aria-live": "polite" });
  const problem = problemLine();
  const pager = el("nav", { class: "pager", "aria-label": "Pages" });
  let etag = null;
  let stopped = false;

  const setFilter = (key, value) => {
    const next = { ...filters, [key]: value, page: key === "page" ? value : 1 };
    const query = new URLSearchParams(Object.entries(next).filter(([, v]) => v && !(v === 1)));
    location.hash = `#/jobs${query.toString() ? `?${query}` : ""}`;
  };

  const stateSelect = el(
    "select",
    { id: "filter-state", onchange: (e) => setFilter("state", e.target.value) },
    STATES.map((s) => el("option", { value: s, selected: s === filters.state }, s || "any state")),
  );
  const userInput = el("input", { id: "filter-user", type: "search", value: filters.user, placeholder: "user", maxlength: 64 });
  const textInput = el("input", { id: "filter-text", type: "search", value: filters.q, placeholder: "name or id", maxlength: 128 });
  const form = el(
    "form",
    { class: "filters", role: "search" },
    el("label", { for: "filter-state" }, "State"),
    stateSelect,
    el("label", { for: "filter-user" }, "User"),
    userInput,
    el("label", { for: "filter-text" }, "Search"),
    textInput,
    el("button", { type: "submit" }, "Filter"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const query = new URLSearchParams(
      Object.entries({ state: filters.state, user: userInput.value.trim(), q: textInput.value.trim() }).filter(([, v]) => v),
    );
    location.hash = `#/jobs${query.toString() ? `?${query}` : ""}`;
  });

  const { table, fill } = dataTable(COLUMNS, [], {
    caption: "Jobs, newest first",
    tableClass: "jobs",
    attrs: (job) => ({ dataset: { job: job.id, state: job.state } }),
    empty: "No jobs match.",
  });
  main.replaceChildren(el("h1", {}, "Jobs"), form, status, problem, el("div", { class: "scroll" }, table), pager);

  async function refresh() {
    const query = new URLSearchParams({ limit: PAGE, offset: (filters.page - 1) * PAGE });
    if (filters.state) query.set("state", filters.state);
    if (filters.user) query.set("user", filters.user);
    if (filters.q) query.set("q", filters.q);
    const result = await api(`api/jobs?${query}`, { etag: etag || "" });
    if (stopped || result.notModified) return;
    if (firstDraw) performance.mark("jobs-data");
    etag = result.etag;
    draw(result.data);
  }

  let firstDraw = true;
  function draw(page) {
    fill(page.items);
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
  const poller = poll(refresh, POLL_MS, problem, "Refreshing the list");
  let pending = null;
  const stopStream = stream("api/stream", {
    state: () => {
      clearTimeout(pending);
      pending = setTimeout(poller.now, 150);
    },
  });
  return () => {
    stopped = true;
    stopStream();
    poller.stop();
    clearTimeout(pending);
  };
}

const COLUMNS = [
  { title: "ID", cell: (job) => el("a", { href: `#/jobs/${job.id}` }, job.id) },
  { title: "Name", class: "name", cell: (job) => el("a", { href: `#/jobs/${job.id}` }, job.name) },
  { title: "State", cell: (job) => badge(job.state) },
  { title: "User", cell: (job) => job.user },
  {
    title: "GPUs",
    class: "mono",
    cell: (job) => [
      gpusOf(job),
      job.allocation?.simulated ? el("span", { class: "badge sim", title: "simulated GPUs (CPU logical devices)" }, "sim") : null,
    ],
  },
  { title: "Progress", cell: (job) => progress(job) },
  { title: "Loss", class: "num", cell: (job) => number(job.latest.loss) },
  { title: "Accuracy", class: "num", cell: (job) => percent(job.latest.eval_accuracy ?? job.latest.accuracy) },
  { title: "Age", class: "num", cell: (job) => el("span", { title: job.created_at }, age(job.created_at)) },
  {
    title: "Queue",
    class: "queue",
    cell: (job) =>
      job.state === "queued"
        ? [
            job.queue_position ? el("strong", {}, `#${job.queue_position} `) : "",
            job.pending_reason || "waiting for the scheduler",
            job.expected_start_at ? el("span", { class: "expected" }, `; starts ${expectedStart(job)}`) : "",
          ]
        : "",
  },
];
