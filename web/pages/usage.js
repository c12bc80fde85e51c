// Usage: who held the GPUs over the last day or week (stacked per user, and a timeline per
// GPU), the queue's length and wait, and the fair-share ranking as the scheduler sees it now.
import { COLORS, fitToWidth } from "../charts.js";
import { api, dataTable, duration, el, formField, poll, problemLine, problemText, session, toast } from "../lib.js";
import uPlot from "../vendor/uplot/uPlot.esm.js";

const WINDOWS = { day: 86400, week: 7 * 86400 };
const POINTS = 300; // samples across the window for the stacked chart
const HEIGHT = 220;
const POLL_MS = 30000;

export async function render(main, params) {
  await session.ready;
  const span = WINDOWS[params.window] ? params.window : "day";
  const by = params.by === "group" ? "group" : "user";
  const keyOf = by === "group" ? (a) => a.group ?? "(no group)" : (a) => a.user;
  const problem = problemLine();
  const picker = el(
    "p",
    { class: "chart-controls" },
    ...Object.keys(WINDOWS).map((name) =>
      el(
        "a",
        {
          href: `#/usage?window=${name}${by === "group" ? "&by=group" : ""}`,
          "aria-current": name === span ? "page" : null,
          class: "window",
        },
        `last ${name}`,
      ),
    ),
  );
  // Per user, or per group once the lab has groups (the links show then).
  const perWhat = el(
    "p",
    { class: "chart-controls", id: "per-what", hidden: true },
    ...["user", "group"].map((name) =>
      el("a", { href: `#/usage?window=${span}&by=${name}`, "aria-current": name === by ? "page" : null, class: "by" }, `per ${name}`),
    ),
  );
  const stacked = el("figure", { class: "chart", id: "chart-gpus-per-user" }, el("figcaption", {}, `GPUs in use per ${by}`));
  const totals = el("div", { class: "scroll", id: "usage-totals" });
  const queue = el(
    "figure",
    { class: "chart", id: "chart-queue" },
    el("figcaption", {}, "Queue: jobs waiting, and the median wait of jobs starting"),
  );
  const gantt = el("div", { class: "gantt", id: "gantt", role: "list", "aria-label": "GPU timeline" });
  const fair = el("div", { id: "fair-share" });
  const storage = el("div", { id: "storage" });
  main.replaceChildren(
    el("h1", {}, "Usage"),
    problem,
    picker,
    perWhat,
    stacked,
    totals,
    el("h2", {}, "Who held each GPU"),
    gantt,
    queue,
    el("h2", {}, "Fair share now"),
    el(
      "p",
      { class: "muted" },
      "A job's rank gets its owner's term added: lower goes first. 0: used nothing lately; 0.5: used exactly their share. " +
        "With groups, a user's term is the mean of their group's and their own within it.",
    ),
    fair,
    el("h2", {}, "Storage"),
    storage,
    ...(session.me?.is_admin ? whatIfSection() : []),
  );
  const plots = [];
  const fit = fitToWidth(main, () => plots, HEIGHT);

  async function refresh() {
    const until = new Date();
    const since = new Date(until.getTime() - WINDOWS[span] * 1000);
    const query = `since=${encodeURIComponent(since.toISOString())}&until=${encodeURIComponent(until.toISOString())}`;
    const [timeline, shares, report] = await Promise.all([
      api(`api/usage/timeline?${query}`),
      api("api/fair-share"),
      api(`api/usage?${query}&by=${by}`),
    ]);
    perWhat.hidden = !shares.groups.length && !timeline.allocations.some((a) => a.group);
    const keys = [...new Set(timeline.allocations.map(keyOf))].sort();
    const users = [...new Set(timeline.allocations.map((a) => a.user))].sort();
    const color = (user) => COLORS[users.indexOf(user) % COLORS.length];
    const keyColor = (key) => COLORS[keys.indexOf(key) % COLORS.length];
    for (const plot of plots.splice(0)) plot.destroy();
    plots.push(stackedChart(stacked, timeline, keys, keyOf, keyColor, fit.width()));
    plots.push(queueChart(queue, timeline, fit.width()));
    drawGantt(gantt, timeline, color);
    totals.replaceChildren(totalsTable(report, by));
    fair.replaceChildren(...fairShareTables(shares));
  }
  const poller = poll(refresh, POLL_MS, problem, "Refreshing usage");
  await refresh();
  // Once per visit, not every poll: the server walks every member's uploads to answer it.
  storage.replaceChildren(...storageOf(await api("api/usage/storage")));
  return () => {
    poller.stop();
    fit.stop();
    for (const plot of plots) plot.destroy();
  };
}

const seconds = (iso) => new Date(iso).getTime() / 1000;

// Where the charts begin: the window's start, or, in a lab whose first GPU was taken (or
// first job waited) inside the window (a new lab), a little before that, so its hour of use is not squeezed into the
// last pixels of 24 h.
function shownFrom(timeline) {
  const from = seconds(timeline.since);
  const to = Math.min(seconds(timeline.until), seconds(timeline.now));
  const starts = [
    ...timeline.allocations.map((a) => seconds(a.start)),
    ...timeline.queue.filter((q) => q.queued > 0).map((q) => seconds(q.time)),
  ];
  if (!starts.length) return from;
  const first = Math.min(...starts);
  return first <= from ? from : Math.max(from, first - Math.max(60, 0.05 * (to - first)));
}

// GPUs held per user (or group: `keyOf`) in each of POINTS buckets, stacked. A bucket's value is the GPU-seconds
// held in it over its length (the average GPUs held), so a job shorter than a bucket still
// shows, as a part of a GPU. The scale is the lab: 0 to its GPUs.
function stackedChart(figure, timeline, users, keyOf, color, width) {
  const from = shownFrom(timeline);
  const to = Math.min(seconds(timeline.until), seconds(timeline.now));
  const step = Math.max(1e-9, (to - from) / POINTS);
  const times = Array.from({ length: POINTS }, (_, i) => from + step * i);
  const now = seconds(timeline.now);
  const own = users.map(() => times.map(() => 0));
  timeline.allocations.forEach((a) => {
    const u = users.indexOf(keyOf(a));
    const start = Math.max(seconds(a.start), from);
    const end = Math.min(a.end ? seconds(a.end) : now, to);
    for (let i = Math.max(0, Math.floor((start - from) / step)); i < POINTS && times[i] < end; i += 1) {
      const overlap = Math.min(end, times[i] + step) - Math.max(start, times[i]);
      if (overlap > 0) own[u][i] += (a.fraction * overlap) / step;
    }
  });
  const stacks = [];
  let below = times.map(() => 0);
  own.forEach((column) => {
    below = below.map((v, i) => v + column[i]);
    stacks.push(below);
  });
  const peak = Math.max(0, ...below);
  // uPlot fills each series down to zero: draw the top of the stack first, the bottom last.
  const order = users.map((_, i) => i).reverse();
  const options = {
    width,
    height: HEIGHT,
    scales: { x: { time: true }, y: { range: () => [0, Math.max(1, timeline.gpus, Math.ceil(peak))] } },
    axes: [{}, { label: "GPUs (average held)", size: 60, incrs: [0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256] }],
    series: [
      {},
      ...order.map((i) => ({
        label: users[i],
        stroke: color(users[i]),
        fill: `${color(users[i])}cc`,
        width: 1,
        paths: uPlot.paths.stepped({ align: 1 }),
      })),
    ],
    legend: { live: true },
  };
  figure.dataset.users = users.join(",");
  figure.dataset.scale = String(Math.max(1, timeline.gpus, Math.ceil(peak)));
  figure.dataset.peak = peak.toFixed(3);
  figure.dataset.from = String(Math.round(from));
  figure.querySelector(".uplot")?.remove();
  return new uPlot(options, [times, ...order.map((i) => stacks[i])], figure);
}

// A wait in the unit that reads best for the longest one shown: seconds, minutes or hours.
function waitUnit(longest) {
  if (longest < 120) return { name: "s", per: 1 };
  if (longest < 2 * 3600) return { name: "min", per: 60 };
  return { name: "h", per: 3600 };
}

function queueChart(figure, timeline, width) {
  const from = shownFrom(timeline);
  const shown = timeline.queue.filter((q) => seconds(q.time) >= from);
  const times = shown.map((q) => seconds(q.time));
  const waits = shown.map((q) => q.median_wait_s).filter((w) => w !== null);
  const unit = waitUnit(Math.max(0, ...waits));
  const most = Math.max(0, ...shown.map((q) => q.queued));
  const longest = Math.max(0, ...waits) / unit.per;
  const options = {
    width,
    height: HEIGHT,
    scales: {
      x: { time: true },
      y: { range: () => [0, Math.max(1, most)] },
      wait: { range: () => [0, Math.max(1, Math.ceil(longest))] },
    },
    axes: [
      {},
      { label: "jobs waiting", size: 60, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000] },
      { label: `median wait (${unit.name})`, scale: "wait", side: 1, size: 60, incrs: [1, 2, 5, 10, 15, 30, 60, 120, 240] },
    ],
    series: [
      {},
      { label: "waiting", stroke: COLORS[0], width: 1.5 },
      { label: `median wait (${unit.name})`, stroke: COLORS[1], scale: "wait", width: 0, points: { show: true, size: 5 } },
    ],
  };
  const data = [times, shown.map((q) => q.queued), shown.map((q) => (q.median_wait_s === null ? null : q.median_wait_s / unit.per))];
  figure.dataset.most = String(most);
  figure.dataset.unit = unit.name;
  figure.querySelector(".uplot")?.remove();
  return new uPlot(options, data, figure);
}

// One row per GPU; each allocation a bar from its start to its end (or now), a link to its job.
function drawGantt(box, timeline, color) {
  const from = shownFrom(timeline);
  const to = seconds(timeline.until);
  const now = seconds(timeline.now);
  const rows = new Map();
  for (const a of timeline.allocations) {
    const key = `${a.host}:${a.gpu}`;
    if (!rows.has(key)) rows.set(key, []);
    rows.get(key).push(a);
  }
  if (!rows.size) {
    box.replaceChildren(el("p", { class: "muted" }, "No GPU was held in this window."));
    return;
  }
  const place = (t) => `${((100 * (Math.min(Math.max(t, from), to) - from)) / (to - from)).toFixed(3)}%`;
  const axis = el(
    "div",
    { class: "gantt-row gantt-axis", "aria-hidden": "true" },
    el("span"),
    el(
      "div",
      { class: "gantt-scale" },
      el("span", {}, new Date(from * 1000).toLocaleString()),
      el("span", {}, new Date(timeline.until).toLocaleString()),
    ),
  );
  box.replaceChildren(
    axis,
    ...[...rows.entries()].map(([key, held]) =>
      el(
        "div",
        { class: "gantt-row", role: "listitem", dataset: { gpu: key } },
        el("span", { class: "gantt-label" }, key),
        el(
          "div",
          { class: "gantt-track" },
          held.map((a) => {
            const start = seconds(a.start);
            const end = a.end ? seconds(a.end) : now;
            const left = place(start);
            const width = `calc(${place(end)} - ${left})`;
            const span = `${new Date(a.start).toLocaleString()} – ${a.end ? new Date(a.end).toLocaleString() : "now"}`;
            return el(
              "a",
              {
                class: "gantt-bar",
                href: `#/jobs/${a.job_id}`,
                title: `job ${a.job_id} ${a.job_name} · ${a.user}${a.fraction < 1 ? ` · ×${a.fraction}` : ""} · ${span} (${duration(end - start)})`,
                style: `left:${left};width:${width};background:${color(a.user)};opacity:${0.4 + 0.6 * a.fraction}`,
                dataset: { job: a.job_id },
              },
              el("span", { class: "visually-hidden" }, `job ${a.job_id} of ${a.user}`),
            );
          }),
        ),
      ),
    ),
  );
}

// The fair-share tree when the lab has groups: each group's row (its term is the first
// level), then its users'; without groups, the users alone.
// Per user or group over the window: GPU hours, jobs, waits (submit to first start), and how
// busy the GPUs were where their workers sampled them ("–": simulated GPUs, never sampled).
function totalsTable(report, by) {
  const busy = (r) => (r.gpu_busy_pct === null ? "–" : `${Math.round(r.gpu_busy_pct)}%`);
  const columns = [
    { title: by === "group" ? "Group" : "User", cell: (r) => r.key },
    { title: "GPU-hours", class: "num", cell: (r) => r.gpu_hours.toFixed(1) },
    { title: "Jobs", class: "num", cell: (r) => String(r.jobs) },
    { title: "Median wait", class: "num", cell: (r) => (r.median_wait_s === null ? "–" : duration(r.median_wait_s)) },
    { title: "p95 wait", class: "num", cell: (r) => (r.p95_wait_s === null ? "–" : duration(r.p95_wait_s)) },
    { title: "GPUs busy", class: "num", cell: busy },
  ];
  return dataTable(columns, report.rows, {
    tableClass: "usage-totals",
    caption: `GPU hours, waits and GPU use per ${by}`,
    attrs: (r) => ({ dataset: { key: r.key } }),
    empty: "No GPU was held in this window.",
  }).table;
}

function fairShareTables(shares) {
  const users = fairShareTable(shares);
  if (!shares.groups.length) return [el("div", { class: "scroll" }, users)];
  const part = (v) => (v === null ? "–" : v.toFixed(3));
  const quotas = (g) =>
    [
      g.max_gpus !== null ? `${g.max_gpus} GPUs at once` : null,
      g.max_gpu_hours_week !== null ? `${g.gpu_hours_week.toFixed(1)} of ${g.max_gpu_hours_week} GPU-h this week` : null,
    ]
      .filter(Boolean)
      .join("; ") || "none";
  const columns = [
    { title: "Group", cell: (g) => g.group ?? "(no group)" },
    { title: "Share", class: "num", cell: (g) => String(g.share) },
    { title: "Decayed GPU-hours", class: "num", cell: (g) => g.usage_gpu_hours.toFixed(2) },
    { title: "Running GPUs", class: "num", cell: (g) => String(g.running_gpus) },
    { title: "Queued jobs", class: "num", cell: (g) => String(g.queued_jobs) },
    { title: "Owed", class: "num", cell: (g) => part(g.owed) },
    { title: "Used", class: "num", cell: (g) => part(g.used) },
    { title: "Term", class: "num", cell: (g) => part(g.term) },
    { title: "Quotas", cell: quotas },
  ];
  const groups = dataTable(columns, shares.groups, {
    tableClass: "fair-share-groups",
    caption: "fair share between groups",
    attrs: (g) => ({ dataset: { group: g.group ?? "" } }),
  }).table;
  return [el("div", { class: "scroll" }, groups), el("div", { class: "scroll" }, users)];
}

function fairShareTable(shares) {
  const part = (v) => (v === null ? "–" : v.toFixed(3));
  const grouped = shares.groups.length > 0;
  const columns = [
    { title: "User", cell: (u) => u.user },
    ...(grouped ? [{ title: "Group", cell: (u) => u.group ?? "(no group)" }] : []),
    { title: "Share", class: "num", cell: (u) => String(u.share) },
    { title: "Decayed GPU-hours", class: "num", cell: (u) => u.usage_gpu_hours.toFixed(2) },
    { title: "Running GPUs", class: "num", cell: (u) => String(u.running_gpus) },
    { title: "Queued jobs", class: "num", cell: (u) => String(u.queued_jobs) },
    { title: "Owed", class: "num", cell: (u) => part(u.owed) },
    { title: "Used", class: "num", cell: (u) => part(u.used) },
    { title: "Term", class: "num", cell: (u) => part(u.term) },
  ];
  return dataTable(columns, shares.users, {
    tableClass: "fair-share",
    caption: "fair share",
    attrs: (u) => ({ dataset: { user: u.user, group: u.group ?? "" } }),
    empty: "Nobody has used a GPU lately.",
  }).table;
}

const GB = 1e9;
const size = (n) => (n >= GB ? `${(n / GB).toFixed(1)} GB` : n >= 1e6 ? `${(n / 1e6).toFixed(1)} MB` : `${Math.round(n / 1e3)} kB`);

// Each member's uploads and job folders beside the quotas (TOWERQ_USER_*_QUOTA_BYTES).
function storageOf(stored) {
  const columns = [
    { title: "User", cell: (row) => row.user },
    { title: `Datasets (of ${size(stored.datasets_quota_bytes)})`, cell: (row) => size(row.datasets_bytes), class: "num" },
    { title: `Code (of ${size(stored.code_quota_bytes)})`, cell: (row) => size(row.code_bytes), class: "num" },
    { title: "Job folders", cell: (row) => size(row.job_folders_bytes), class: "num" },
    { title: "Job logs", cell: (row) => size(row.log_bytes), class: "num" },
    { title: "Metric points", cell: (row) => row.metric_points.toLocaleString(), class: "num" },
  ];
  const folders = stored.job_folder_max_bytes
    ? `each job's folder at most ${size(stored.job_folder_max_bytes)}`
    : "no limit per job folder";
  const limit = `${folders}, each job's log at most ${size(stored.job_log_max_bytes)} over all its attempts`;
  return [
    el("p", { class: "muted" }, `What each member's uploads and jobs take on the lab's storage; ${limit}.`),
    stored.users.length
      ? el("div", { class: "scroll" }, dataTable(columns, stored.users, { caption: "Storage per user" }).table)
      : el("p", { class: "muted" }, "Nothing stored yet."),
  ];
}

// What if (admins): the lab's own ended jobs of a window replayed on the lab as it is and
// with other settings (time slicing, GPUs, policy), side by side, before changing anything.
const WHAT_IF_ROWS = [
  ["jobs", "Jobs replayed", String],
  ["avg_jct_s", "Avg job completion", duration],
  ["user_avg_jct_s", "Avg job completion, each user once", duration],
  ["p95_jct_s", "p95 job completion", duration],
  ["avg_wait_s", "Avg wait", duration],
  ["p95_wait_s", "p95 wait", duration],
  ["max_wait_s", "Max wait", duration],
  ["utilization", "GPUs busy", (v) => `${(100 * v).toFixed(1)}%`],
];

function whatIfSection() {
  const result = el("div", { id: "what-if-result" });
  const said = el("p", { class: "error", role: "alert" });
  const form = el(
    "form",
    { class: "admin-form", id: "what-if", novalidate: true },
    formField(
      "Replay",
      el(
        "select",
        { id: "wi-days", name: "days" },
        el("option", { value: "7" }, "last week"),
        el("option", { value: "30", selected: true }, "last 30 days"),
      ),
    ),
    formField(
      "Time slice (GPU-hours)",
      el("input", { id: "wi-slice", name: "slice", type: "number", min: "0", step: "any", placeholder: "as now" }),
      "0: no time slicing",
    ),
    formField("Hosts", el("input", { id: "wi-hosts", name: "hosts", type: "number", min: "1", step: "1", placeholder: "as now" })),
    formField(
      "GPUs per host",
      el("input", { id: "wi-gpus", name: "gpus_per_host", type: "number", min: "1", step: "1", placeholder: "as now" }),
    ),
    formField(
      "Policy",
      el(
        "select",
        { id: "wi-policy", name: "policy" },
        ["", "towerq", "fit-first", "fifo"].map((p) => el("option", { value: p }, p || "as now")),
      ),
    ),
    el("button", { type: "submit" }, "Replay"),
    said,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    said.textContent = "";
    const data = new FormData(form);
    const until = new Date();
    const body = { since: new Date(until.getTime() - Number(data.get("days")) * 86400 * 1000).toISOString(), until: until.toISOString() };
    if (data.get("slice") !== "") body.time_slice_gpu_s = Number(data.get("slice")) * 3600;
    if (data.get("hosts") !== "") body.hosts = Number(data.get("hosts"));
    if (data.get("gpus_per_host") !== "") body.gpus_per_host = Number(data.get("gpus_per_host"));
    if (data.get("policy")) body.policy = data.get("policy");
    result.replaceChildren(el("p", { class: "muted" }, "Replaying…"));
    try {
      result.replaceChildren(...whatIfTables(await api("api/usage/what-if", { method: "POST", body })));
    } catch (error) {
      result.replaceChildren();
      said.textContent = problemText(error);
      toast("The replay failed");
    }
  });
  return [
    el("h2", {}, "What if (admins)"),
    el(
      "p",
      { class: "muted" },
      "The lab's own ended jobs replayed through the scheduler, on the lab as it is and with the settings below, side by side. Nothing changes.",
    ),
    form,
    result,
  ];
}

function setupText(setup) {
  const slice = setup.time_slice_gpu_s ? `slice ${setup.time_slice_gpu_s / 3600} GPU-h` : "no slicing";
  return `${setup.hosts} × ${setup.gpus_per_host} GPUs, ${setup.policy}, ${slice}`;
}

function whatIfTables(answer) {
  const { now, what_if: other } = answer;
  const ratio = (a, b) => (a ? `${(b / a).toFixed(2)}×` : "–");
  const columns = [
    { title: "", cell: (row) => row[1] },
    { title: `As now (${setupText(now.setup)})`, class: "num", cell: (row) => row[2](now[row[0]]) },
    { title: `What if (${setupText(other.setup)})`, class: "num", cell: (row) => row[2](other[row[0]]) },
    { title: "What if / now", class: "num", cell: (row) => (row[0] === "jobs" ? "" : ratio(now[row[0]], other[row[0]])) },
  ];
  const summary = dataTable(columns, WHAT_IF_ROWS, {
    tableClass: "what-if",
    caption: "what if",
    attrs: (row) => ({ dataset: { metric: row[0] } }),
  }).table;
  const users = Object.keys(now.per_user).sort((a, b) => now.per_user[b].gpu_hours - now.per_user[a].gpu_hours);
  const perUser = dataTable(
    [
      { title: "User", cell: (u) => u },
      { title: "GPU-hours", class: "num", cell: (u) => now.per_user[u].gpu_hours.toFixed(1) },
      { title: "p95 wait, as now", class: "num", cell: (u) => duration(now.per_user[u].p95_wait_s) },
      { title: "p95 wait, what if", class: "num", cell: (u) => duration(other.per_user[u]?.p95_wait_s ?? 0) },
    ],
    users,
    { tableClass: "what-if-users", caption: "what if, per user", attrs: (u) => ({ dataset: { user: u } }) },
  ).table;
  const left = answer.never_ran ? ` ${answer.never_ran} jobs that never held a GPU are left out.` : "";
  return [
    el("p", { class: "muted" }, `${answer.jobs} jobs, ${now.gpu_hours.toFixed(1)} GPU-hours of work.${left}`),
    el("div", { class: "scroll" }, summary),
    el("div", { class: "scroll" }, perUser),
  ];
}
