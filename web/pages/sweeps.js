// Sweeps: every sweep with its progress and best job.
import { api, badge, dataTable, el, poll, problemLine, when } from "../lib.js";

export async function render(main) {
  const problem = problemLine();
  const table = dataTable(COLUMNS, [], {
    caption: "Sweeps",
    attrs: (s) => ({ "data-sweep": s.id }),
    empty: "No sweeps yet: towerq sweep SPEC.yaml, or POST /api/sweeps.",
  });
  main.replaceChildren(el("h1", {}, "Sweeps"), problem, el("div", { class: "scroll" }, table.table));
  const refresh = async () => table.fill((await api("api/sweeps")).items);
  await refresh();
  const poller = poll(refresh, 5000, problem, "Refreshing the sweeps");
  return () => poller.stop();
}

const COLUMNS = [
  { title: "Sweep", cell: (s) => el("a", { href: `#/sweeps/${s.id}` }, `#${s.id} ${s.name}`) },
  { title: "User", cell: (s) => s.user },
  { title: "Progress", cell: (s) => `${s.done}/${s.total}` },
  { title: "States", cell: (s) => Object.entries(s.counts).map(([state, n]) => [badge(state), ` ${n} `]) },
  { title: "Best", cell: (s) => (s.best_job ? el("a", { href: `#/jobs/${s.best_job}` }, `job ${s.best_job}`) : "–") },
  { title: "Metric", cell: (s) => `${s.metric} (${s.goal})` },
  { title: "Created", cell: (s) => when(s.created_at) },
];
