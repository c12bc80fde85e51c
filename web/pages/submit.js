// Submit: a form built from what the API offers (/api/catalog), with a GPU picker; the
// API's validation errors appear next to the field they name. `?clone=ID` fills it in.
import { api, ApiError, el, toast } from "/lib.js";

const HIDDEN_HYPERPARAMETERS = new Set(["model_options"]);

export async function render(main, params) {
  const [catalog, gpus] = await Promise.all([api("/api/catalog"), api("/api/gpus")]);
  const source = params.clone ? (await api(`/api/jobs/${Number(params.clone)}`)).spec : null;
  const hosts = [...new Set(gpus.map((g) => g.host))];
  const form = el("form", { class: "submit", novalidate: true });
  const formError = el("p", { class: "error", id: "form-error", role: "alert" });
  const fields = {};

  const field = (id, label, input, help = "") => {
    fields[id] = input;
    input.id = `f-${id}`;
    const error = el("span", { class: "field-error", id: `err-${id}`, "aria-live": "polite" });
    input.setAttribute("aria-describedby", `err-${id}`);
    return el("div", { class: "field" }, el("label", { for: input.id }, label), input, help ? el("small", { class: "muted" }, help) : null, error);
  };

  const model = el("select", {}, catalog.models.map((m) => el("option", { value: m.name, title: m.description }, `${m.name} — ${m.description}`)));
  const dataset = el("input", { list: "datasets", required: true, maxlength: 1024, value: "digits" });
  const datasets = el("datalist", { id: "datasets" }, catalog.datasets.map((d) => el("option", { value: d.name }, d.description)));
  const datasetOptions = el("textarea", { rows: 2, placeholder: '{"shape": [28, 28, 3], "classes": 10}' });
  const name = el("input", { maxlength: 128, placeholder: "model-dataset" });

  const hyper = Object.entries(catalog.hyperparameters).filter(([key]) => !HIDDEN_HYPERPARAMETERS.has(key));
  const hyperFields = hyper.map(([key, schema]) => field(`hyperparameters.${key}`, key.replaceAll("_", " "), inputFor(schema), schema.description || ""));
  const modelOptions = el("textarea", { rows: 2, placeholder: '{"hidden": [128, 64]}' });

  const host = el("select", {}, hosts.map((h) => el("option", { value: h }, h)));
  const picker = el("fieldset", { class: "gpu-picker", id: "gpu-picker", tabindex: -1 }, el("legend", {}, "GPUs"));
  fields.gpus = picker;
  const mode = { pick: el("input", { type: "radio", name: "gpu-mode", value: "pick", id: "mode-pick", checked: true }),
    count: el("input", { type: "radio", name: "gpu-mode", value: "count", id: "mode-count" }) };
  const gpuCount = el("input", { type: "number", min: 1, max: 64, value: 1 });
  const fraction = el("input", { type: "number", min: 0.05, max: 1, step: 0.05, value: 1 });
  const priority = el("select", {}, catalog.priorities.map((p) => el("option", { value: p, selected: p === "normal" }, p)));
  const timeLimit = el("input", { type: "number", min: 1, placeholder: "none" });
  const variableDevice = el("select", {}, catalog.variable_devices.map((d) => el("option", { value: d }, d)));
  const towerWeights = el("input", { placeholder: "e.g. 2,1", pattern: "[0-9., ]*" });

  const drawPicker = () => {
    const onHost = gpus.filter((g) => g.host === host.value);
    picker.replaceChildren(el("legend", {}, `GPUs on ${host.value || "—"}`), ...onHost.map((g) => {
      const unusable = g.drained || g.host_state !== "up";
      const box = el("input", { type: "checkbox", value: g.index, id: `gpu-${g.index}`, disabled: unusable, dataset: { unusable: unusable ? "1" : "0" } });
      const who = g.holders.length ? g.holders.map((h) => `job ${h.job_id} (${h.user}${h.fraction < 1 ? `, ${h.fraction}` : ""})`).join(", ") : "free";
      return el("label", { class: "gpu-choice", for: box.id }, box, ` GPU ${g.index} `, el("span", { class: "muted" }, `${g.name}${g.simulated ? " (simulated)" : ""} · ${who}`));
    }));
    picker.append(el("span", { class: "field-error", id: "err-gpus", "aria-live": "polite" }));
    const free = onHost.find((g) => g.free_fraction >= 1 && !g.drained && g.host_state === "up");
    const first = picker.querySelector(free ? `#gpu-${free.index}` : "input:not([disabled])");
    if (first && !picker.querySelector("input:checked")) first.checked = true;
    switchMode();
  };
  const switchMode = () => {
    picker.querySelectorAll("input").forEach((box) => { box.disabled = mode.count.checked || box.dataset.unusable === "1"; });
    gpuCount.disabled = mode.pick.checked;
  };
  host.addEventListener("change", drawPicker);
  mode.pick.addEventListener("change", switchMode);
  mode.count.addEventListener("change", switchMode);

  form.append(
    el("h1", {}, source ? `Submit (clone of job ${params.clone})` : "Submit a job"),
    formError,
    el("fieldset", {}, el("legend", {}, "What"),
      field("name", "Name", name),
      field("model", "Model", model),
      field("dataset", "Dataset", dataset, "a name, or npz:PATH, tfrecord:PATTERN, images:FOLDER under the data folder"), datasets,
      field("dataset_options", "Dataset options (JSON)", datasetOptions)),
    el("fieldset", {}, el("legend", {}, "Hyperparameters"), ...hyperFields, field("hyperparameters.model_options", "Model options (JSON)", modelOptions)),
    el("fieldset", {}, el("legend", {}, "Where and when"),
      field("host", "Host", host),
      el("div", { class: "field" }, el("span", { class: "label" }, "GPU choice"),
        el("label", { for: "mode-pick", class: "inline" }, mode.pick, " these GPUs"),
        el("label", { for: "mode-count", class: "inline" }, mode.count, " any GPUs")),
      picker,
      field("gpu_count", "How many GPUs", gpuCount),
      field("gpu_memory_fraction", "Memory fraction of each GPU", fraction, "below 1: GPUs may be shared with other such jobs"),
      field("tower_weights", "Tower weights", towerWeights, "unequal batch slices for unequal GPUs"),
      field("variable_device", "Variables on", variableDevice),
      field("priority", "Priority", priority),
      field("time_limit_s", "Time limit (s)", timeLimit)),
    el("p", {}, el("button", { type: "submit", id: "submit" }, "Submit")),
  );
  main.replaceChildren(form);
  drawPicker();
  if (source) fill(source);

  function fill(spec) {
    name.value = spec.name ?? "";
    model.value = spec.model;
    dataset.value = spec.dataset;
    const options = Object.fromEntries(Object.entries(spec.dataset_options || {}).filter(([, v]) => v !== null));
    datasetOptions.value = Object.keys(options).length ? JSON.stringify(options) : "";
    for (const [key] of hyper) setValue(fields[`hyperparameters.${key}`], spec.hyperparameters[key]);
    modelOptions.value = Object.keys(spec.hyperparameters.model_options || {}).length ? JSON.stringify(spec.hyperparameters.model_options) : "";
    if (spec.host) host.value = spec.host;
    drawPicker();
    if (spec.gpus) {
      mode.pick.checked = true;
      picker.querySelectorAll("input").forEach((box) => { box.checked = spec.gpus.includes(Number(box.value)); });
    } else {
      mode.count.checked = true;
      gpuCount.value = spec.gpu_count;
    }
    switchMode();
    fraction.value = spec.gpu_memory_fraction;
    towerWeights.value = spec.tower_weights ? spec.tower_weights.join(",") : "";
    variableDevice.value = spec.variable_device;
    priority.value = spec.priority;
    timeLimit.value = spec.time_limit_s ?? "";
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors();
    let spec;
    try {
      spec = collect();
    } catch (error) {
      showError(error.field, error.message);
      return;
    }
    const button = form.querySelector("#submit");
    button.disabled = true;
    try {
      const job = await api("/api/jobs", { method: "POST", body: spec });
      toast(`Job ${job.id} submitted`);
      location.hash = `#/jobs/${job.id}`;
    } catch (error) {
      if (error instanceof ApiError && Array.isArray(error.detail)) {
        for (const problem of error.detail) showError(problem.loc.slice(1).join("."), problem.msg);
      } else {
        formError.textContent = error.message;
      }
    } finally {
      button.disabled = false;
    }
  });

  function collect() {
    const spec = { model: model.value, dataset: dataset.value.trim(), hyperparameters: {} };
    if (name.value.trim()) spec.name = name.value.trim();
    spec.dataset_options = parseJson(datasetOptions.value, "dataset_options");
    for (const [key, schema] of hyper) {
      const value = readValue(fields[`hyperparameters.${key}`], schema);
      if (value !== undefined) spec.hyperparameters[key] = value;
    }
    spec.hyperparameters.model_options = parseJson(modelOptions.value, "hyperparameters.model_options");
    if (hosts.length) spec.host = host.value;
    if (mode.pick.checked) {
      spec.gpus = [...picker.querySelectorAll("input:checked")].map((box) => Number(box.value));
      if (!spec.gpus.length) throw Object.assign(new Error("pick at least one GPU"), { field: "gpus" });
    } else {
      spec.gpu_count = Number(gpuCount.value);
    }
    spec.gpu_memory_fraction = Number(fraction.value);
    if (towerWeights.value.trim()) spec.tower_weights = towerWeights.value.split(",").map((w) => Number(w.trim()));
    spec.variable_device = variableDevice.value;
    spec.priority = priority.value;
    if (timeLimit.value) spec.time_limit_s = Number(timeLimit.value);
    return spec;
  }

  function clearErrors() {
    formError.textContent = "";
    form.querySelectorAll(".field-error").forEach((e) => { e.textContent = ""; });
    form.querySelectorAll("[aria-invalid]").forEach((e) => e.removeAttribute("aria-invalid"));
  }

  function showError(path, message) {
    const key = path in fields ? path : path.split(".").slice(0, 2).join(".") in fields ? path.split(".").slice(0, 2).join(".") : path.split(".")[0];
    const box = form.querySelector(`#err-${CSS.escape(key)}`);
    if (box && fields[key]) {
      box.textContent = message;
      fields[key].setAttribute("aria-invalid", "true");
      if (!form.querySelector("[aria-invalid]:focus")) fields[key].focus();
    } else {
      formError.textContent = `${formError.textContent} ${message}`.trim();
    }
  }
}

function inputFor(schema) {
  const types = schema.anyOf ? schema.anyOf.map((s) => s.type) : [schema.type];
  const base = schema.anyOf ? schema.anyOf.find((s) => s.type !== "null") : schema;
  if (schema.enum || base.enum) {
    return el("select", {}, (schema.enum || base.enum).map((v) => el("option", { value: v, selected: v === schema.default }, v)));
  }
  if (types.includes("boolean")) return el("input", { type: "checkbox", checked: schema.default === true });
  const input = el("input", { type: "number", step: types.includes("integer") ? 1 : "any" });
  for (const [json, attr] of [["minimum", "min"], ["maximum", "max"]]) if (base[json] !== undefined) input.setAttribute(attr, base[json]);
  if (schema.default !== null && schema.default !== undefined) input.value = schema.default;
  else input.placeholder = "auto";
  return input;
}

function readValue(input, schema) {
  if (input.type === "checkbox") return input.checked;
  if (input.tagName === "SELECT") return input.value;
  if (input.value === "") return undefined;
  return Number(input.value);
}

function setValue(input, value) {
  if (input.type === "checkbox") input.checked = Boolean(value);
  else input.value = value ?? "";
}

function parseJson(text, fieldName) {
  if (!text.trim()) return {};
  try {
    return JSON.parse(text);
  } catch {
    throw Object.assign(new Error("not valid JSON"), { field: fieldName });
  }
}
