// A job's files on its page: its code bundle and its artifacts, with the links to take them home.
import { dataTable, el, when } from "../lib.js";

const FINAL = ["succeeded", "failed", "cancelled"];

const FILES_SHOWN = 200;

// The job's code bundle: its files, each readable in the browser.
export function codeOf(bundle, jobId) {
  const columns = [
    {
      title: "File",
      cell: (f) =>
        el(
          "a",
          {
            href: `api/code/${bundle.id}/files/${f.path.split("/").map(encodeURIComponent).join("/")}?job=${jobId}`,
            target: "_blank",
            class: "mono",
          },
          f.path,
        ),
    },
    { title: "Size", cell: (f) => bytes(f.size), class: "num" },
  ];
  return [
    el("h2", { id: "code-title" }, "Code"),
    el(
      "p",
      { class: "muted" },
      `Bundle ${bundle.id.slice(0, 12)}… · ${bundle.files.length} file${bundle.files.length === 1 ? "" : "s"} · ${bytes(bundle.size)}`,
    ),
    el("div", { class: "scroll" }, dataTable(columns, bundle.files.slice(0, FILES_SHOWN), { caption: "Code files" }).table),
  ];
}

// Links to take the job's results home: the model, everything, the whole log, each file.
export function artifactsOf(job, listing) {
  const title = el("h2", { id: "artifacts-title" }, "Artifacts");
  if (!listing.items.length) {
    return [title, el("p", { class: "muted" }, FINAL.includes(job.state) ? "None." : "None yet: the job has not written any.")];
  }
  const base = `api/jobs/${job.id}`;
  const has = (path) => listing.items.some((item) => item.path === path);
  // TensorBoard events wherever the job wrote them: the trainer's tensorboard/, a program's runs/ or lightning_logs/
  const boards = listing.items.some((item) => item.path.split("/").pop().includes("tfevents"));
  const link = (href, text, attrs = {}) => el("a", { href, download: "", ...attrs }, text);
  const quick = [
    has("model.keras") ? link(`${base}/artifacts/model.keras`, "model.keras", { id: "download-model" }) : null,
    link(`${base}/artifacts.tar.gz`, `everything (.tar.gz, ${bytes(listing.total_bytes)})`, { id: "download-all" }),
    link(`${base}/logs.txt`, "the whole log", { id: "download-log" }),
    boards ? link(`${base}/tensorboard.tar.gz`, "TensorBoard events (.tar.gz)", { id: "download-tensorboard" }) : null,
  ].filter(Boolean);
  const columns = [
    {
      title: "File",
      cell: (item) => link(`${base}/artifacts/${item.path.split("/").map(encodeURIComponent).join("/")}`, item.path, { class: "mono" }),
    },
    { title: "Size", cell: (item) => bytes(item.size), class: "num" },
    { title: "Modified", cell: (item) => when(item.modified) },
  ];
  const shown = listing.items.slice(0, FILES_SHOWN);
  const more = listing.items.length - shown.length + (listing.truncated ? 1 : 0);
  return [
    title,
    el("p", { class: "links" }, "Download: ", ...quick.flatMap((a, i) => (i ? [" · ", a] : [a]))),
    // Offered only where there are events to look at (a job that failed early wrote none).
    boards
      ? el("p", { class: "muted", id: "tensorboard-hint" }, "TensorBoard at home: ", el("code", {}, `towerq tensorboard ${job.id}`))
      : null,
    el("div", { class: "scroll" }, dataTable(columns, shown, { caption: "Files" }).table),
    more > 0
      ? el("p", { class: "muted" }, `and ${more}${listing.truncated ? "+" : ""} more files: download everything to see them all.`)
      : null,
  ].filter(Boolean);
}

function bytes(count) {
  const units = ["B", "kB", "MB", "GB", "TB"];
  let value = count;
  let unit = 0;
  while (value >= 1000 && unit < units.length - 1) {
    value /= 1000;
    unit += 1;
  }
  return unit ? `${value.toFixed(1)} ${units[unit]}` : `${value} B`;
}
