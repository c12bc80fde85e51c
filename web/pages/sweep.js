// One sweep: its settings against their results (sortable, best marked), the result
// against each swept field, every job's curve overlaid, links to the jobs, cancel all.
import { allMetrics, COLORS, fitToWidth, lineChart } from "../charts.js";
import { api, badge, confirmThen, dataTable, el, number, poll, problemLine, session } from "../lib.js";
import uPlot from "../vendor/uplot/uPlot.esm.js";

const FINAL = ["succeeded", "failed", "cancelled"];
const CHART_HEIGHT = 260;
const CURVES_SHOWN = 24;

export async function render(main, params) {
  await session.ready;
  const id = Number(params.id);
  let sweep = await api(`api/sweeps/${id}`);
  const problem = problemLine();
  const header = el("div", { class: "job-header" });
  const summary = el("p", { class: "muted", id: "sweep-summary" });
  const tableBox = el("div", { class: "scroll", id: "sweep-table" });
  const scatterBox = el("div", { class: "charts", id: "sweep-results" });
  const curveBox = el("div", { class: "chart wide", id: "sweep-curves" });
  main.replaceChildren(
    header,
    problem,
    summary,
    tableBox,
    el("h2", {}, `${sweep.metric} against each swept field`),
    scatterBox,
    el("h2", {}, "Training loss of every job"),
    curveBox,
  );
  let sortKey = "result";
  let ascending = sweep.goal === "min";
  const plots = [];
  const fit = fitToWidth(main, () => plots, CHART_HEIGHT, true);

  const draw = () => {
    header.replaceChildren(...headerOf(sweep, reload));
    const early = sweep.early_stopping;
    const stopped = (sweep.rungs || []).filter((r) => r.stopped);
    summary.textContent =
      `${sweep.done} of ${sweep.total} done · metric ${sweep.metric} (${sweep.goal})` +
      (sweep.max_parallel ? ` · at most ${sweep.max_parallel} at once` : "") +
      (early
        ? ` · early stopping (ASHA): rungs from step ${early.min_steps}, 1 in ${early.reduction_factor} goes on · ${stopped.length} stopped early`
        : "") +
      (sweep.metric_missing ? ` · ${sweep.metric_missing}` : "");
    const rows = sweep.jobs.map((j) => ({ ...j, rung: lastRung(sweep, j.id)?.rung ?? null })).sort(compare(sortKey, ascending));
    const columns = [
      { key: "id", title: "Job", cell: (j) => el("a", { href: `#/jobs/${j.id}` }, `#${j.id}`) },
      { key: "state", title: "State", cell: (j) => badge(j.state) },
      ...sweep.fields.map((f) => ({ key: f, title: f.replace("hyperparameters.", ""), cell: (j) => String(j.setting[f]), class: "num" })),
      {
        key: "result",
        title: sweep.metric,
        cell: (j) => [number(j.result), j.id === sweep.best_job ? el("span", { class: "badge best" }, " best") : ""],
        class: "num",
      },
      { key: "step", title: "Step", cell: (j) => (j.total_steps ? `${j.step ?? 0}/${j.total_steps}` : String(j.step ?? 0)), class: "num" },
      ...(early ? [{ key: "rung", title: "Rung", cell: (j) => rungOf(sweep, j.id), class: "num" }] : []),
    ];
    const table = dataTable(columns, rows, {
      caption: "Settings and results",
      attrs: (j) => ({ "data-job": j.id, class: j.id === sweep.best_job ? "best" : null }),
    }).table;
    table.querySelectorAll("thead th").forEach((th, i) => {
      const key = columns[i].key;
      th.append(
        el(
          "button",
          {
            type: "button",
            class: "quiet sort",
            "aria-label": `Sort by ${columns[i].title}`,
            onclick: () => {
              ascending = sortKey === key ? !ascending : true;
              sortKey = key;
              draw();
            },
          },
          sortKey === key ? (ascending ? " ▲" : " ▼") : " ↕",
        ),
      );
    });
    tableBox.replaceChildren(table);
    drawScatters();
  };

  const drawScatters = () => {
    for (const plot of plots.splice(0)) plot.destroy();
    scatterBox.replaceChildren();
    for (const field of sweep.fields) {
      const points = sweep.jobs
        .filter((j) => j.result !== null && typeof j.setting[field] === "number")
        .sort((a, b) => a.setting[field] - b.setting[field]);
      if (!points.length) continue;
      const holder = el("figure", { class: "chart", "data-field": field }, el("figcaption", {}, field.replace("hyperparameters.", "")));
      scatterBox.append(holder);
      // Values that span an order of magnitude (a learning rate, a weight decay) are compared
      // as multiples: a log axis. Whole numbers (a seed, a batch size) get whole ticks.
      const values = points.map((j) => j.setting[field]);
      const logX = values.every((v) => v > 0) && values.at(-1) / values[0] >= 10;
      const whole = values.every(Number.isInteger);
      holder.dataset.scale = logX ? "log" : "linear";
      holder.dataset.ticks = whole ? "whole" : "any";
      const xAxis = { label: field.replace("hyperparameters.", "") };
      if (whole && !logX) {
        xAxis.incrs = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000];
        xAxis.values = (_, ticks) => ticks.map((t) => (Number.isInteger(t) ? String(t) : ""));
      }
      const options = {
        width: fit.width(),
        height: CHART_HEIGHT,
        scales: { x: { time: false, distr: logX ? 3 : 1 } },
        axes: [xAxis, { label: sweep.metric, size: 64 }],
        series: [{ label: field }, { label: sweep.metric, stroke: COLORS[0], paths: () => null, points: { show: true, size: 8 } }],
        legend: { live: true },
      };
      plots.push(new uPlot(options, [points.map((j) => j.setting[field]), points.map((j) => j.result)], holder));
    }
  };

  let curves = null;
  const drawCurves = async () => {
    const jobs = sweep.jobs.slice(0, CURVES_SHOWN);
    const series = await Promise.all(jobs.map((j) => allMetrics(j.id, "train")));
    const steps = [...new Set(series.flat().map((m) => m.step))].sort((a, b) => a - b);
    const columns = series.map((points) => {
      const byStep = new Map(points.map((m) => [m.step, m.loss]));
      return steps.map((s) => byStep.get(s) ?? null);
    });
    if (curves) curves.destroy();
    curveBox.replaceChildren();
    const lines = jobs.map((j, i) => ({ label: `#${j.id}`, color: COLORS[i % COLORS.length] }));
    curves = lineChart(curveBox, { width: curveBox.clientWidth || 800, height: CHART_HEIGHT, yLabel: "loss", lines }, [steps, ...columns]);
    curveBox.dataset.series = String(jobs.length);
  };

  async function reload() {
    sweep = await api(`api/sweeps/${id}`);
    draw();
    await drawCurves();
  }
  draw();
  await drawCurves();
  const poller = poll(() => sweep.done === sweep.total || reload(), 5000, problem, "Reloading the sweep");
  return () => {
    poller.stop();
    fit.stop();
    for (const plot of plots) plot.destroy();
    if (curves) curves.destroy();
  };
}

// An adaptive sweep's setting at the last rung it reached (null: none yet).
function lastRung(sweep, jobId) {
  const mine = (sweep.rungs || []).filter((r) => r.job_id === jobId);
  return mine.length ? mine.reduce((a, b) => (b.rung > a.rung ? b : a)) : null;
}

// What the Rung column says: past it, stopped there (with the cut), or ended before it.
function rungOf(sweep, jobId) {
  const last = lastRung(sweep, jobId);
  if (!last) return "–";
  if (last.stopped) return el("span", { class: "badge stopped", title: `the rung's cut: ${number(last.cut)}` }, `stopped at ${last.rung}`);
  return last.value === null ? `ended before ${last.rung}` : `past ${last.rung}`;
}

function compare(key, ascending) {
  const own = ["result", "id", "state", "step", "rung"];
  const value = (j) => (own.includes(key) ? j[key] : j.setting[key]);
  return (a, b) => {
    const x = value(a);
    const y = value(b);
    if (x === y) return a.id - b.id;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * (ascending ? 1 : -1);
  };
}

function headerOf(sweep, reload) {
  const unfinished = sweep.jobs.some((j) => !FINAL.includes(j.state));
  const mine = session.me && (session.me.user === sweep.user || session.me.is_admin);
  const cancel = el(
    "button",
    {
      type: "button",
      class: "danger",
      id: "cancel-sweep",
      disabled: !unfinished || !mine,
      onclick: confirmThen(
        () => `Cancel every unfinished job of sweep ${sweep.id}?`,
        async () => {
          await api(`api/sweeps/${sweep.id}/cancel`, { method: "POST" });
          return `Sweep ${sweep.id}: cancel requested`;
        },
        "Cancelling the sweep",
        reload,
      ),
    },
    "Cancel all",
  );
  // A finished sweep has nothing to cancel: no button, rather than a dead one.
  return [
    el("h1", {}, el("span", { class: "muted" }, `Sweep #${sweep.id} `), sweep.name),
    el("div", { class: "actions" }, unfinished ? cancel : null),
  ];
}
