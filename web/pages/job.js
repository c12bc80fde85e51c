// One job: live charts, spec, allocation, history, artifacts, log tail; Cancel, Clone, Change.
import { metricsOverview } from "../charts.js";
import {
  ApiError,
  actionForm,
  actThen,
  age,
  api,
  badge,
  clockOf,
  confirmThen,
  dataTable,
  duration,
  durationOf,
  el,
  eta,
  expectedStart,
  formInput,
  gpusOf,
  localMoment,
  number,
  percent,
  poll,
  problemLine,
  progress,
  reportError,
  session,
  speed,
  stream,
  when,
} from "../lib.js";
import { Charts, Series } from "./job-charts.js";
import { artifactsOf, codeOf } from "./job-files.js";

const FINAL = ["succeeded", "failed", "cancelled"];
const LOG_LINES_SHOWN = 1000;
// How long the first live point after a (re)connect waits for the points before it to be stored.
const GAP_TRIES = 20;
const GAP_RETRY_MS = 500;

export async function render(main, params) {
  await session.ready;
  const id = Number(params.id);
  let job = await api(`api/jobs/${id}`);
  const series = new Series();
  for (const split of ["train", "eval"]) series.add(await metricsOverview(id, split));

  const header = el("div", { class: "job-header" });
  const summary = el("dl", { class: "summary" });
  const changeBox = el("div", { class: "change-job" });
  const details = el("div", { class: "details" });
  const logBox = el("pre", { class: "log", tabindex: 0, "aria-label": "Trainer log" });
  const follow = el("input", { type: "checkbox", id: "follow", checked: true });
  const charts = new Charts(
    series,
    async (range) => {
      // A zoomed range comes again from the server, at full resolution when it is short enough.
      for (const split of ["train", "eval"]) series.add(await metricsOverview(id, split, range));
      charts.draw();
      const inRange = series.steps.filter((s) => s >= range.min && s <= range.max && series.byStep.get(s).loss !== undefined);
      charts.box.dataset.zoomPoints = String(inRange.length);
    },
    () => job,
  );
  const problem = problemLine();
  const artifacts = el("section", { "aria-labelledby": "artifacts-title", id: "artifacts" });
  const code = job.spec.code ? el("section", { "aria-labelledby": "code-title", id: "code" }) : null;

  main.replaceChildren(
    header,
    problem,
    summary,
    changeBox,
    el(
      "section",
      { "aria-labelledby": "charts-title" },
      el("h2", { id: "charts-title" }, "Training"),
      charts.controls(),
      charts.empty,
      charts.box,
    ),
    details,
    ...(code ? [code] : []), // replaceChildren would show a null as the text "null"
    artifacts,
    el(
      "section",
      { "aria-labelledby": "log-title" },
      el("h2", { id: "log-title" }, "Log ", el("label", { class: "inline" }, follow, " follow")),
      logBox,
    ),
  );

  let changeDrawn = null; // what the change form shows: redrawn when that changes, not while someone types
  // The newest warning of the attempt a queued job waits to start ("its requirements could
  // not be installed on lab-a while it waits"): its reason does not say it, its log does.
  let warned = null;
  const drawJob = () => {
    header.replaceChildren(...headerOf(job, reload));
    summary.replaceChildren(...summaryOf(job, warned));
    details.replaceChildren(...detailsOf(job, reload));
    const shown = JSON.stringify([job.state, job.name, job.priority, job.spec.time_limit_s, job.spec.begin_at, job.attempts]);
    if (shown !== changeDrawn) {
      changeDrawn = shown;
      changeBox.replaceChildren(...changeFormOf(job, reload));
    }
  };
  // A member's log, artifacts and code are theirs unless the job is shared (visibility: lab).
  const readable = job.outputs_readable !== false;
  const privateNote = (what) =>
    el("p", { class: "muted private-note" }, `${what} private to ${job.user} (and admins); they can share them with towerq share ${id}.`);
  const drawArtifacts = async () =>
    artifacts.replaceChildren(
      ...(readable
        ? artifactsOf(job, await api(`api/jobs/${id}/artifacts`))
        : [el("h2", { id: "artifacts-title" }, "Artifacts"), privateNote("The artifacts are")]),
    );
  async function reload() {
    const before = job.state;
    job = await api(`api/jobs/${id}`);
    drawJob();
    if (!series.steps.length) charts.draw(); // its words follow the state
    if (job.state !== before) await drawArtifacts();
  }
  drawJob();
  charts.draw();
  await drawArtifacts();
  if (code)
    code.replaceChildren(...(readable ? await codeOrWhy(job, id) : [el("h2", { id: "code-title" }, "Code"), privateNote("The code is")]));

  const appendLog = (lines) => {
    const before = warned;
    for (const line of lines) {
      logBox.append(el("span", { class: `level-${line.level}` }, `${line.time.slice(11, 19)} ${line.message}\n`));
      if ((line.level === "warning" || line.level === "error") && line.attempt === job.attempts) warned = line;
    }
    if (warned !== before && job.state === "queued") summary.replaceChildren(...summaryOf(job, warned));
    while (logBox.childNodes.length > LOG_LINES_SHOWN) logBox.firstChild.remove();
    if (follow.checked) logBox.scrollTop = logBox.scrollHeight;
  };
  if (readable) appendLog(await api(`api/jobs/${id}/logs?tail=200`));
  else logBox.replaceChildren(privateNote("The log is"));

  let redraw = null;
  // State changes must show as fast as metrics: a change between the first load and the
  // stream's start was not streamed (reload on open), and a metric proves the job runs. One
  // reload at a time; a change during one asks for one more.
  let reloading = false;
  let again = false;
  const catchUp = () => {
    if (reloading) {
      again = true;
      return;
    }
    reloading = true;
    reload()
      .catch(reportError("Reloading the job", problem))
      .finally(() => {
        reloading = false;
        if (again) {
          again = false;
          catchUp();
        }
      });
  };
  // The points stored between the first load and the stream's start came on no stream; nor
  // did those published before it listened but stored after (the worker writes in batches):
  // the first live point after each (re)connect is preceded by what is stored up to it.
  // Live points wait for the fetch a (re)connect starts: drawn before it, the newest point
  // would stand alone on the chart for a moment, as if the job had just begun.
  let openedAfter = null;
  let opening = null;
  const fillGap = async (after, upTo = 2 ** 31 - 1) => {
    for (let tries = 1; ; tries++) {
      const rows = await metricsOverview(id, "train", { min: after + 1, max: upTo });
      series.add(rows);
      if (upTo === 2 ** 31 - 1 || rows.some((row) => row.step >= upTo) || tries === GAP_TRIES) break;
      await new Promise((resolve) => setTimeout(resolve, GAP_RETRY_MS));
    }
    series.add(await metricsOverview(id, "eval", { min: after + 1, max: upTo }));
    later(() => {});
  };
  const stop = stream(`api/jobs/${id}/stream`, {
    open: () => {
      catchUp();
      openedAfter = series.steps.length ? series.steps.at(-1) : -1;
      const fetched = fillGap(openedAfter).catch(reportError("Loading the latest metrics", problem));
      opening = fetched;
      fetched.then(() => {
        if (opening === fetched) opening = null;
      });
    },
    metric: (point) => {
      if (openedAfter !== null && point.step > openedAfter + 1) {
        fillGap(openedAfter, point.step).catch(reportError("Loading the latest metrics", problem));
      }
      openedAfter = null;
      afterOpening(() => {
        if (job.state !== "running" && !FINAL.includes(job.state)) catchUp();
        series.add([{ ...point, split: "train" }]);
        if (point.step >= (job.step ?? 0)) {
          job.step = point.step;
          const { loss, accuracy, examples_per_sec, step_time_s } = point;
          Object.assign(job.latest, { loss, accuracy, examples_per_sec, step_time_s: step_time_s ?? job.latest.step_time_s });
        }
      });
    },
    eval: (point) =>
      afterOpening(() => {
        series.add([{ ...point, split: "eval" }]);
        Object.assign(job.latest, { eval_loss: point.loss, eval_accuracy: point.accuracy });
      }),
    log: (line) => appendLog([line]),
    state: catchUp,
  });
  function afterOpening(change) {
    if (opening) opening.then(() => later(change));
    else later(change);
  }
  function later(change) {
    change();
    if (!redraw) {
      redraw = requestAnimationFrame(() => {
        redraw = null;
        charts.draw();
        summary.replaceChildren(...summaryOf(job));
      });
    }
  }
  const poller = poll(() => FINAL.includes(job.state) || reload(), 5000, problem, "Reloading the job");
  return () => {
    stop();
    poller.stop();
    charts.destroy();
  };
}

function headerOf(job, reload) {
  const mine = session.me && (session.me.user === job.user || session.me.is_admin);
  const cancel = el(
    "button",
    {
      type: "button",
      class: "danger",
      id: "cancel",
      disabled: job.cancel_requested || !mine,
      title: mine ? "Checkpoint and stop this job" : "Only its owner or an admin may cancel it",
      onclick: confirmThen(
        () => `Cancel job ${job.id} (${job.name})?`,
        async () => {
          await api(`api/jobs/${job.id}/cancel`, { method: "POST" });
          return `Job ${job.id}: cancel requested`;
        },
        "Cancel",
        reload,
      ),
    },
    job.cancel_requested && !FINAL.includes(job.state) ? "Stopping…" : "Cancel",
  );
  const clone = el("a", { class: "button", href: `#/submit?clone=${job.id}`, id: "clone" }, "Clone");
  // Queued, or handed to a cluster that places jobs itself (Slurm) and pending there.
  const waiting = job.state === "queued" || (job.state === "dispatched" && session.me.places_jobs === false);
  const hold = waiting && mine ? holdButton(job, reload) : null;
  // A notebook session's JupyterLab (its owner and admins), a path of the API as the page is served.
  const open =
    job.url && job.state === "running" && mine
      ? el(
          "a",
          {
            class: "button",
            id: "open-session",
            href: job.url.replace(/^\//, ""),
            target: "_blank",
            rel: "noopener",
            title: "Open this session's JupyterLab in a new tab",
          },
          "Open",
        )
      : null;
  // ... and its terminal in the member's own (`towerq shell ID`)
  const shell = open
    ? el("p", { class: "muted", id: "shell-hint" }, "A shell on its GPUs in your terminal: ", el("code", {}, `towerq shell ${job.id}`))
    : null;
  return [
    el("h1", {}, el("span", { class: "muted" }, `#${job.id} `), job.name, " ", badge(job.state)),
    el("div", { class: "actions" }, open, hold, FINAL.includes(job.state) ? null : cancel, clone), // nothing to cancel once ended
    shell,
  ].filter(Boolean);
}

// Hold a queued job (it waits until released; on Slurm, also one pending there), or release
// it: an admin's hold on a member's job only an admin releases (the button says so rather
// than fail).
function holdButton(job, reload) {
  const held = Boolean(job.on_hold_by);
  const adminsOnly = held && job.on_hold_by !== session.me.user && !session.me.is_admin;
  const action = held ? "release" : "hold";
  return el(
    "button",
    {
      type: "button",
      id: "hold",
      disabled: adminsOnly,
      title: adminsOnly
        ? `Put on hold by ${job.on_hold_by}, an admin: only an admin may release it`
        : held
          ? "Let it start again: it queues as if it had waited only while not on hold"
          : "Keep it from starting until you release it",
      onclick: actThen(
        async () => {
          await api(`api/jobs/${job.id}/${action}`, { method: "POST" });
          return held ? `Job ${job.id} released` : `Job ${job.id} on hold: Release lets it start`;
        },
        held ? "Release" : "Hold",
        reload,
      ),
    },
    held ? "Release" : "Hold",
  );
}

// A job of yours (or any, for admins) renamed; while it waits, its priority changed; its
// time limit until it ends (PATCH: only what differs from what it has; once it started,
// only an admin lengthens it); until it first runs, its begin (emptied: it may start now).
// Nothing once it has ended.
function changeFormOf(job, reload) {
  const mine = session.me && (session.me.user === job.user || session.me.is_admin);
  if (!mine || FINAL.includes(job.state)) return [];
  const queued = job.state === "queued";
  const neverRan = queued && !job.started_at && job.attempts <= 1;
  const limit = job.spec.time_limit_s ? duration(job.spec.time_limit_s) : "";
  const begin = job.spec.begin_at ? localMoment(new Date(job.spec.begin_at)) : "";
  const priorities = ["low", "normal", "high"].map((p) => el("option", { value: p, selected: p === job.priority }, p));
  const fields = [formInput("Name", el("input", { name: "name", value: job.name, maxlength: 128, required: true }))];
  if (queued) fields.push(formInput("Priority", el("select", { name: "priority" }, priorities)));
  fields.push(
    formInput(
      "Time limit",
      el("input", { name: "time_limit", value: limit, placeholder: "none", inputmode: "text" }),
      queued
        ? "stops it after this long once it runs: 2h, 90m, 1:30:00"
        : "from this attempt's start: 2h, 90m, 1:30:00 (only an admin lengthens it)",
    ),
  );
  if (neverRan) {
    const input = el("input", { type: "datetime-local", name: "begin_at", value: begin });
    fields.push(formInput("Not before", input, "it starts no earlier than this, your clock (empty: as soon as it can)"));
  }
  const form = actionForm(
    neverRan ? "Name, priority, time limit, begin" : queued ? "Name, priority, time limit" : "Name, time limit",
    "change-job",
    fields,
    "Change",
    async (data) => {
      const body = {};
      if (data.get("name").trim() !== job.name) body.name = data.get("name").trim();
      if (queued && data.get("priority") !== job.priority) body.priority = data.get("priority");
      const asked = data.get("time_limit").trim();
      if (asked !== limit) body.time_limit_s = durationOf(asked, "time_limit_s", "Time limit: ");
      const beginAsked = neverRan ? data.get("begin_at") : begin;
      if (beginAsked !== begin) body.begin_at = (beginAsked ? new Date(beginAsked) : new Date()).toISOString();
      if (!Object.keys(body).length) throw new Error("Nothing changed: edit a field first");
      await api(`api/jobs/${job.id}`, { method: "PATCH", body });
      return `Job ${job.id}: ${Object.keys(body)
        .map((key) => CHANGED[key])
        .join(", ")} changed`;
    },
    reload,
  );
  return [el("details", { id: "change" }, el("summary", {}, "Change"), form)];
}

const CHANGED = { name: "name", priority: "priority", time_limit_s: "time limit", begin_at: "begin" };

// "1h 30m"; while it runs, when it stops it (each attempt has the whole limit from its start).
function timeLimitText(job) {
  const limit = job.spec.time_limit_s;
  if (!limit) return "none";
  const last = job.held?.at(-1);
  if (job.state !== "running" || !last || last.until) return duration(limit);
  return `${duration(limit)} · stops it ~${clockOf(new Date(Date.parse(last.since) + limit * 1000))}`;
}

// "busy 31% of the time, at most 20,000 of 81,559 MiB held", as its workers sampled the driver.
function gpuUseText(use) {
  const peak = use.memory_peak_mb;
  const total = use.memory_total_mb ? ` of ${use.memory_total_mb.toLocaleString("en-US")}` : "";
  const held = peak === null ? "" : `, at most ${peak.toLocaleString("en-US")}${total} MiB held`;
  const idle = use.idle_since ? ` · idle since ${clockOf(new Date(use.idle_since))}` : "";
  return `busy ${use.busy_pct}% of the time${held}${idle}`;
}

function summaryOf(job, warned = null) {
  const pairs = [
    ["Owner", job.group ? `${job.user} · group ${job.group}` : job.user],
    ["Progress", progress(job)],
    ["Train loss", number(job.latest.loss)],
    ["Train accuracy", percent(job.latest.accuracy)],
    ["Eval loss", number(job.latest.eval_loss)],
    ["Eval accuracy", percent(job.latest.eval_accuracy)],
    ["Examples/s", speed(job) ?? "–"],
    ...(job.gpu_use ? [["GPU use", gpuUseText(job.gpu_use)]] : []),
    ["ETA", duration(eta(job))],
    ["Attempt", `${job.attempts}${job.crashes ? ` · ${job.crashes} crashed` : ""} · gives up after ${job.max_attempts} crashes`],
    ["Priority", job.priority],
    ["Time limit", timeLimitText(job)],
    ["Submitted", `${when(job.created_at)} (${age(job.created_at)} ago)`],
    ...(job.spec.begin_at ? [["Not before", when(job.spec.begin_at)]] : []),
    ["Started", when(job.started_at)],
    ["Finished", when(job.finished_at)],
  ];
  if (job.sweep_id) pairs.splice(1, 0, ["Sweep", el("a", { href: `#/sweeps/${job.sweep_id}`, id: "sweep-link" }, `#${job.sweep_id}`)]);
  if (job.state === "queued") {
    const position = job.queue_position ? `#${job.queue_position}: ` : "";
    const said = warned && warned.attempt === job.attempts;
    // Without its log (another member's job) the reason says where its requirements failed.
    const why = (said ? job.pending_reason : job.reason) || "waiting for the scheduler";
    pairs.splice(1, 0, ["Queue", `${position}${why}`]);
    if (job.expected_start_at) pairs.splice(2, 0, ["Expected start", expectedStart(job)]);
    if (said) {
      pairs.splice(2, 0, ["Warned", el("span", { class: `level-${warned.level}` }, `${warned.time.slice(11, 16)} ${warned.message}`)]);
    }
  } else if (job.state === "dispatched" && job.reason) {
    // Handed to an executor's cluster that still holds it (Slurm's pending reason), or stopping.
    pairs.splice(1, 0, ["Waiting", job.reason]);
    if (job.expected_start_at) pairs.splice(2, 0, ["Expected start", expectedStart(job)]);
  }
  // A failure in red; a cancel is someone's choice, said plainly (its reason is the "error").
  if (job.error && job.state === "cancelled") pairs.splice(1, 0, ["Cancelled", job.error]);
  else if (job.error) pairs.splice(1, 0, ["Error", el("span", { class: "error" }, job.error)]);
  return pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { dataset: { field: k } }, v)]);
}

// The job's code bundle, or, where the API no longer has it (its files gone from the
// storage), why not: the rest of the page (its log) is still shown.
async function codeOrWhy(job, id) {
  try {
    return codeOf(await api(`api/code/${job.spec.code}?job=${id}`), id);
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    return [
      el("h2", { id: "code-title" }, "Code"),
      el("p", { class: "muted", id: "code-missing" }, `Its code cannot be shown: ${err.message}`),
    ];
  }
}

// How a job's memory fraction is kept: by TensorFlow in the trainer's process (a model job),
// or by its worker, which stops a program (a command job, a notebook) that holds more (NVML).
function fractionOf(job, program) {
  const f = job.gpu_memory_fraction;
  if (program) {
    const note =
      f >= 1
        ? ""
        : job.allocation?.simulated
          ? " (not watched on simulated GPUs)"
          : " (watched by its worker: past it, the job is stopped)";
    const title =
      "Its worker reads its processes' GPU memory from NVML every second and stops it when they hold more than this share of a GPU";
    return el("dd", { title }, `${f}${note}`);
  }
  const note =
    job.memory_limit_enforced === false ? " (not enforced on simulated GPUs)" : f < 1 ? " (kept by TensorFlow in this job's process)" : "";
  const title =
    "A limit TensorFlow keeps in this job's own process; other code on the GPU is not bound by it (docs/deployment.md: MIG, MPS)";
  return el("dd", { title }, `${f}${note}`);
}

function detailsOf(job, reload) {
  const a = job.allocation;
  // A program of the member's own (a command job, a notebook): no towers, no batch norm of towerq's trainer.
  const program = Boolean(job.spec.command) || job.spec.kind === "notebook";
  const placement = el(
    "section",
    { "aria-labelledby": "placement-title" },
    el("h2", { id: "placement-title" }, "Placement"),
    el(
      "dl",
      { class: "summary" },
      el("dt", {}, "GPUs"),
      el("dd", { class: "mono" }, gpusOf(job), a?.simulated ? el("span", { class: "badge sim" }, "simulated") : null),
      ...(a?.ranks?.length > 1
        ? [
            el("dt", {}, "Ranks"),
            el(
              "dd",
              { id: "ranks" },
              el(
                "ul",
                { class: "ranks" },
                a.ranks.map((r) =>
                  el(
                    "li",
                    { dataset: { rank: r.rank } },
                    `rank ${r.rank}${r.rank === 0 ? " (writes metrics and checkpoints)" : ""}: `,
                    el("span", { class: "mono" }, `GPUs ${r.gpus.join(",")} on ${r.host}`),
                  ),
                ),
              ),
            ),
          ]
        : []),
      ...(job.held?.length > 1 || job.min_gpu_count != null
        ? [
            el("dt", {}, "GPUs held"),
            el(
              "dd",
              { id: "held" },
              el(
                "ul",
                { class: "ranks" },
                (job.held || []).map((h) =>
                  el(
                    "li",
                    { dataset: { attempt: h.attempt, gpus: h.gpus } },
                    `attempt ${h.attempt}: ${h.gpus} GPU${h.gpus === 1 ? "" : "s"} on ${h.host}, ${when(h.since)} – ${h.until ? when(h.until) : "now"}`,
                    h.from_step ? el("span", { class: "muted" }, ` (from step ${h.from_step.toLocaleString()})`) : "",
                  ),
                ),
              ),
            ),
          ]
        : []),
      el("dt", {}, "GPU UUIDs"),
      el("dd", { class: "mono" }, a ? (a.ranks?.length > 1 ? a.ranks.flatMap((r) => r.gpu_uuids) : a.gpu_uuids).join(", ") : "–"),
      el("dt", {}, "Memory fraction"),
      fractionOf(job, program),
      el("dt", {}, "CUDA_VISIBLE_DEVICES"),
      el("dd", { class: "mono" }, job.cuda_visible_devices ?? "–"),
      ...(program
        ? []
        : [
            el("dt", {}, "Batch norm"),
            el("dd", { id: "batch-norm" }, batchNormOf(job.batch_norm)),
            el("dt", {}, "Towers"),
            el("dd", {}, job.towers ?? "–", job.devices ? el("span", { class: "muted mono" }, ` (${job.devices.join(", ")})`) : ""),
          ]),
    ),
  );
  const history = el(
    "section",
    { "aria-labelledby": "history-title" },
    el("h2", { id: "history-title" }, "History"),
    el("div", { class: "scroll" }, dataTable(HISTORY_COLUMNS, job.events).table),
  );
  const spec = el(
    "section",
    { "aria-labelledby": "spec-title" },
    el("h2", { id: "spec-title" }, "Spec"),
    el("pre", { class: "spec" }, JSON.stringify(job.spec, null, 2)),
  );
  if (!job.notifications?.length) return [placement, history, spec];
  // The webhooks owed for it (its end, its GPUs gone idle): whether each got through.
  const webhooks = el(
    "section",
    { "aria-labelledby": "webhooks-title", id: "webhooks" },
    el("h2", { id: "webhooks-title" }, "Webhooks"),
    el(
      "div",
      { class: "scroll" },
      dataTable(webhookColumns(job, reload), job.notifications, { attrs: (n) => ({ dataset: { event: n.event, state: n.state } }) }).table,
    ),
  );
  return [placement, history, webhooks, spec];
}

// A delivery that failed is sent again by its job's owner or an admin, once its receiver is
// mended (the same body and delivery number, as GitHub redelivers a hook).
function webhookColumns(job, reload) {
  const mine = session.me && (session.me.user === job.user || session.me.is_admin);
  const resend = (n) =>
    el(
      "button",
      {
        type: "button",
        class: "resend",
        onclick: actThen(
          async () => {
            await api(`api/jobs/${job.id}/notifications/${n.id}/resend`, { method: "POST" });
            return `Webhook ${n.event} sent again`;
          },
          "Send again",
          reload,
        ),
      },
      "Send again",
    );
  return [
    { title: "Event", cell: (n) => n.event },
    { title: "To", cell: (n) => n.url ?? "the lab's webhook" },
    { title: "State", cell: (n) => (n.state === "delivered" ? `delivered ${when(n.delivered_at)}` : n.state) },
    { title: "Attempts", cell: (n) => n.attempts },
    { title: "Last error", cell: (n) => (n.last_error ? el("span", { class: n.state === "failed" ? "error" : "" }, n.last_error) : "") },
    { title: "", cell: (n) => (n.state === "failed" && mine ? resend(n) : "") },
  ];
}

// Where batch norm is synchronised across towers, and where it is not (inside custom layers).
function batchNormOf(report) {
  if (!report) return "–";
  const { synchronized, per_tower: perTower } = report;
  if (!synchronized.length && !perTower.length) return "none in this model";
  return [
    synchronized.length ? el("div", {}, `synchronised across towers: ${synchronized.join(", ")}`) : null,
    perTower.length ? el("div", { class: "error" }, `per tower, not synchronised: ${perTower.join(", ")}`) : null,
  ];
}

const HISTORY_COLUMNS = [
  { title: "Time", cell: (e) => when(e.time) },
  { title: "State", cell: (e) => badge(e.state) },
  { title: "Attempt", cell: (e) => e.attempt },
  { title: "Why", cell: (e) => e.message || "" },
];

// Metric points by step, train and eval, as the aligned columns uPlot draws.
