// Charts and the metric series behind them, shared by the job and compare pages.

import { api } from "./lib.js";
import uPlot from "./vendor/uplot/uPlot.esm.js";

export const COLORS = ["#2563eb", "#dc2626", "#059669", "#7c3aed", "#d97706", "#0891b2", "#be185d", "#4b5563"];
const METRICS_PAGE = 20000; // the most points the API gives per call

// A job's whole series of one split, a page at a time.
export async function allMetrics(id, split) {
  const points = [];
  for (let after = -1; ; ) {
    const page = await api(`api/jobs/${id}/metrics?split=${split}&after_step=${after}&limit=${METRICS_PAGE}`);
    points.push(...page);
    if (page.length < METRICS_PAGE) return points;
    after = page[page.length - 1].step;
  }
}

// About two points per pixel of a wide chart: what a job page asks for at once, down-sampled
// on the server; a range zoomed into is asked for again, at full resolution when it fits.
export const CHART_POINTS = 2000;

// One split of a job's series, down-sampled to CHART_POINTS (within `range` of steps if given).
export function metricsOverview(id, split, range = null) {
  let query = `api/jobs/${id}/metrics?split=${split}&points=${CHART_POINTS}`;
  if (range) query += `&after_step=${Math.max(-1, Math.floor(range.min) - 1)}&until_step=${Math.max(0, Math.ceil(range.max))}`;
  return api(query);
}

// A tick's label for small or spread values (a learning rate, a loss on a log scale): three
// significant digits without trailing zeros ("0.0005", not "0.000500"; "0", not "0.00"), and
// powers of ten past four decimals ("1e-5"), where the default said "0".
export function tickText(v) {
  if (v === null || v === undefined) return "";
  if (v === 0) return "0";
  const size = Math.abs(v);
  if (size >= 1e-4 && size < 1e6) return String(Number(v.toPrecision(3)));
  return v
    .toExponential(2)
    .replace(/\.?0+e/, "e")
    .replace("e+", "e");
}

// Dashed vertical lines at steps, each labelled (`marks()` = [{ step, label }]), drawn over a chart.
function drawMarks(u, marks) {
  const { ctx, bbox } = u;
  ctx.save();
  ctx.strokeStyle = "#6b7280";
  ctx.fillStyle = "#374151";
  ctx.setLineDash([4, 4]);
  ctx.font = `${Math.round(11 * devicePixelRatio)}px sans-serif`;
  for (const mark of marks) {
    const x = Math.round(u.valToPos(mark.step, "x", true));
    if (x < bbox.left || x > bbox.left + bbox.width) continue;
    ctx.beginPath();
    ctx.moveTo(x, bbox.top);
    ctx.lineTo(x, bbox.top + bbox.height);
    ctx.stroke();
    ctx.fillText(mark.label, x + 4, bbox.top + 12 * devicePixelRatio);
  }
  ctx.restore();
}

// A line chart over steps: `lines` = [{ label, color, points? }]; `data` = [steps, ...columns].
// `onZoom({ min, max })` hears of a drag across the chart, `onReset()` of the double-click undoing it;
// `marks()` gives the steps to mark (an attempt's start: a resize, a preemption).
export function lineChart(holder, { width, height, yLabel, lines, log = false, precise = false, onZoom, onReset, marks }, data) {
  const options = {
    width,
    height,
    scales: { x: { time: false }, y: log ? { distr: 3 } : {} },
    axes: [{ label: "step" }, { label: yLabel, size: 72, values: precise || log ? (_u, ticks) => ticks.map(tickText) : undefined }],
    series: [
      { label: "step" },
      ...lines.map((l) => ({ label: l.label, stroke: l.color, width: 1.5, spanGaps: true, points: { show: !!l.points } })),
    ],
    cursor: { drag: { x: true, y: false } },
    legend: { live: true },
    hooks: {
      setSelect: [
        (u) => {
          if (onZoom && u.select.width > 0) {
            onZoom({ min: u.posToVal(u.select.left, "x"), max: u.posToVal(u.select.left + u.select.width, "x") });
          }
        },
      ],
      ready: [(u) => onReset && u.over.addEventListener("dblclick", () => onReset())],
      draw: [(u) => marks && drawMarks(u, marks())],
    },
  };
  return new uPlot(options, data, holder);
}

// Keep `plots()` as wide as `box` (one column, or two on a wide screen when `halves`).
export function fitToWidth(box, plots, height, halves = false) {
  const width = () => {
    const full = box.clientWidth || 800;
    return halves && full > 900 ? Math.floor((full - 24) / 2) : full;
  };
  const resize = () => {
    for (const plot of plots()) plot.setSize({ width: width(), height });
  };
  window.addEventListener("resize", resize);
  return { width, stop: () => window.removeEventListener("resize", resize) };
}
