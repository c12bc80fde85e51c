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

  const chosen = chosenKeys();
  let items = [];
  let hyperparameters = [];
  let customs = [];
  let table = null;
  let fill = () => {};
  const tableBox = el("div", { class: "scroll" });
  const pickerList = el("div", { class: "column-list" });
  const picker = el("details", { class: "columns", id: "columns" }, el("summary", {}, "Columns"), pickerList);
  const build = () => {
    // Hyperparameters stand with the figures, before the age and the reason.
    const picked = COLUMNS.filter((c) => c.fixed || chosen.has(c.key));
    const tail = picked.findIndex((c) => c.key === "age" || c.key === "why");
    const at = tail < 0 ? picked.length : tail;
    const extra = [
      ...customs.filter((key) => chosen.has(`m:${key}`)).map(customColumn),
      ...hyperparameters.filter((name) => chosen.has(`hp:${name}`)).map(hyperparameterColumn),
    ];
    const shown = [...picked.slice(0, at), ...extra, ...picked.slice(at)];
    ({ table, fill } = dataTable(shown, items, {
      caption: "Jobs, newest first",
      tableClass: "jobs",
      attrs: (job) => ({ dataset: { job: job.id, state: job.state } }),
      empty:
        filters.state || filters.user || filters.q ? "No jobs match." : "No jobs yet: submit one with the form (Submit) or towerq submit.",
    }));
    tableBox.replaceChildren(table);
  };
  const offer = () => pickerList.replaceChildren(...columnPicker(chosen, customs, hyperparameters, build));
  build();
  offer();
  main.replaceChildren(el("h1", {}, "Jobs"), form, picker, status, problem, tableBox, pager);

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
    items = page.items;
    const names = [...new Set(items.flatMap((job) => Object.keys(job.spec.hyperparameters || {})))].sort();
    const metrics = customNames(items);
    if (names.join() !== hyperparameters.join() || metrics.join() !== customs.join()) {
      hyperparameters = names;
      customs = metrics;
      offer();
      build();
    } else fill(items);
    status.textContent = `${count(page.total)} job${page.total === 1 ? "" : "s"}`;
    const pages = Math.max(1, Math.ceil(page.total / PAGE));
    pager.replaceChildren(
      el("button", { type: "button", disabled: filters.page <= 1, onclick: () => setFilter("page", filters.page - 1) }, "← Newer"),
      el("span", {}, `page ${filters.page} of ${pages}`),
      el("button", { type: "button", disabled: filters.page >= pages, onclick: () => setFilter("page", filters.page + 1) }, "Older →"),
    );
    table.dataset.drawn = "1";
    if (firstDraw) {
      firstDraw = false;
      performance.mark("jobs-table-drawn");
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

// Every column a person may show; `on` marks the default set. Columns of the models' own
// metrics (`m:<split>:<name>`) and of hyperparameters
// (`hp:<name>`) are offered for the names the listed jobs use.
const COLUMNS = [
  { key: "id", title: "ID", fixed: true, cell: (job) => el("a", { href: `#/jobs/${job.id}` }, job.id) },
  { key: "name", title: "Name", fixed: true, class: "name", cell: (job) => el("a", { href: `#/jobs/${job.id}` }, job.name) },
  { key: "state", title: "State", fixed: true, cell: (job) => badge(job.state) },
  { key: "user", title: "User", on: true, cell: (job) => job.user },
  { key: "priority", title: "Priority", cell: (job) => job.priority },
  {
    key: "gpus",
    title: "GPUs",
    on: true,
    class: "mono",
    cell: (job) => [
      gpusOf(job),
      job.allocation?.simulated ? el("span", { class: "badge sim", title: "simulated GPUs (CPU logical devices)" }, "sim") : null,
    ],
  },
  { key: "progress", title: "Progress", on: true, cell: (job) => progress(job) },
  { key: "loss", title: "Train loss", on: true, class: "num", cell: (job) => number(job.latest.loss) },
  { key: "accuracy", title: "Train accuracy", class: "num", cell: (job) => percent(job.latest.accuracy) },
  { key: "eval_loss", title: "Eval loss", class: "num", cell: (job) => number(job.latest.eval_loss) },
  { key: "eval_accuracy", title: "Eval accuracy", on: true, class: "num", cell: (job) => percent(job.latest.eval_accuracy) },
  { key: "age", title: "Age", on: true, class: "num", cell: (job) => el("span", { title: job.created_at }, age(job.created_at)) },
  { key: "why", title: "Why", on: true, class: "why", cell: (job) => why(job) },
];
const CHOSEN_KEY = "towerq.jobs.columns";

// Why a job is where it is, in one line (the whole text on hover): its place and reason
// while it waits, what failed it, who or what cancelled it, why it is being stopped.
function why(job) {
  if (job.state === "queued" || (job.state === "dispatched" && job.reason)) {
    const reason = job.reason || "waiting for the scheduler";
    // A host could not install its requirements (the reason says it first): in the warning's colour.
    const warned = job.state === "queued" && job.requirements_failed_on?.length ? " warned" : "";
    return el(
      "span",
      { class: `reason${warned}`, title: reason },
      job.queue_position ? el("strong", {}, `#${job.queue_position} `) : "",
      reason,
      job.expected_start_at ? el("span", { class: "expected" }, `; starts ${expectedStart(job)}`) : "",
    );
  }
  if (!job.reason) return "";
  const first = job.reason.split("\n")[0];
  return el("span", { class: `reason ${job.state === "failed" ? "failed" : ""}`, title: job.reason }, first);
}

// The model's own metrics (a code bundle's `metrics()`), each split its own column.
const SPLITS = { train: "custom_metrics", eval: "eval_custom_metrics" };

function customNames(items) {
  const names = new Set();
  for (const job of items) {
    for (const [split, field] of Object.entries(SPLITS)) {
      for (const name of Object.keys(job.latest[field] || {})) names.add(`${split}:${name}`);
    }
  }
  return [...names].sort();
}

function customColumn(key) {
  const [split, name] = [key.slice(0, key.indexOf(":")), key.slice(key.indexOf(":") + 1)];
  return {
    key: `m:${key}`,
    title: `${name} (${split})`,
    class: "num",
    cell: (job) => number(job.latest[SPLITS[split]]?.[name]),
  };
}

function hyperparameterColumn(name) {
  return {
    key: `hp:${name}`,
    title: name,
    class: "num",
    cell: (job) => {
      const value = job.spec.hyperparameters?.[name];
      return value === undefined ? "–" : typeof value === "number" ? number(value) : String(value);
    },
  };
}

function chosenKeys() {
  try {
    const saved = JSON.parse(localStorage.getItem(CHOSEN_KEY));
    if (Array.isArray(saved)) return new Set(saved);
  } catch {
    // a damaged setting: the defaults
  }
  return new Set(COLUMNS.filter((c) => c.on).map((c) => c.key));
}

// The "Columns" menu: a checkbox per optional column, per metric of the models' own and per
// hyperparameter the listed jobs use.
function columnPicker(chosen, customs, hyperparameters, changed) {
  const box = (key, title) =>
    el(
      "label",
      {},
      el("input", {
        type: "checkbox",
        value: key,
        checked: chosen.has(key),
        onchange: (event) => {
          if (event.target.checked) chosen.add(key);
          else chosen.delete(key);
          localStorage.setItem(CHOSEN_KEY, JSON.stringify([...chosen]));
          changed();
        },
      }),
      ` ${title}`,
    );
  return [
    ...COLUMNS.filter((c) => !c.fixed).map((c) => box(c.key, c.title)),
    customs.length ? el("span", { class: "muted" }, "The models' own metrics") : null,
    ...customs.map((key) => box(`m:${key}`, customColumn(key).title)),
    hyperparameters.length ? el("span", { class: "muted" }, "Hyperparameters") : null,
    ...hyperparameters.map((name) => box(`hp:${name}`, name)),
  ];
}
