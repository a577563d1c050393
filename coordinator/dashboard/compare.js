// satdar dashboard, the comparison of runs (#compare=ID,ID,...): the loss, validation loss and
// tokens/s of the selected jobs overlaid on one canvas chart each, every job in its own colour,
// a legend with each job's design, and under the cursor a line and a tooltip with every job's
// value at its step nearest the cursor. Uses dashboard.js's helpers (el, fmt, getJson,
// lineChart, column), which load after this file; nothing here runs them before they exist.
//
// For tests in headless Chromium (no mouse): &hover=F (0 <= F <= 1, a fraction of the plot's
// width) sends a real mousemove there after each drawing, so the tooltip is in the DOM. The
// legend items and tooltip rows carry data-job, data-design, data-points, data-step and
// data-value (the exact number the API gave).
"use strict";

const COMPARE_COLORS = ["#2457c5", "#d9661f", "#1b7f3b", "#8e44ad", "#b3261e",
                        "#0f8b8d", "#c2185b", "#6d4c41", "#546e7a", "#9e9d24"];
// key: the suffix of the elements' ids (cmp-chart-KEY, legend-KEY, tip-KEY).
const COMPARE_CHARTS = [
  { key: "loss", field: "loss", digits: 4, dots: false, zero: false },
  { key: "val", field: "val_loss", digits: 4, dots: true, zero: false },
  { key: "tps", field: "tokens_per_second", digits: 0, dots: false, zero: true },
];
const comparePicked = new Set();   // job ids ticked in the jobs table
const compareCharts = {};          // key -> {spec, canvas, tip, lines, geom, hover}
let compareHash = null;            // the hash the charts were last drawn for

// ---- the jobs table's side: a checkbox per job and the Compare button ----

function compareCell(jobId) {
  const td = el("td");
  const box = el("input");
  box.type = "checkbox";
  box.className = "compare-pick";
  box.dataset.job = jobId;
  box.title = "compare " + jobId;
  box.checked = comparePicked.has(jobId);
  box.addEventListener("change", () => {
    if (box.checked) comparePicked.add(jobId); else comparePicked.delete(jobId);
    updateCompareButton();
  });
  td.appendChild(box);
  return td;
}

function updateCompareButton() {
  const button = document.getElementById("compare-button");
  button.disabled = comparePicked.size === 0;
  button.textContent = comparePicked.size ? `Compare ${comparePicked.size}` : "Compare";
}

// {ids, hover} for "#compare=A,B[&hover=F]", else null.
function parseCompareHash(hash) {
  if (!hash.startsWith("#compare=")) return null;
  const params = {};
  for (const part of hash.slice(1).split("&")) {
    const eq = part.indexOf("=");
    if (eq > 0) params[part.slice(0, eq)] = decodeURIComponent(part.slice(eq + 1));
  }
  const ids = [...new Set((params.compare || "").split(",").map(s => s.trim()).filter(Boolean))];
  let hover = params.hover === undefined ? null : Number(params.hover);
  if (hover !== null && !(hover >= 0 && hover <= 1)) hover = null;
  return { ids, hover };
}

// ---- drawing ----

// The index of the point with a finite value whose step is nearest `step`; -1 when none.
function nearestIndex(xs, ys, step) {
  let best = -1;
  for (let i = 0; i < xs.length; i++) {
    if (ys[i] === null || !Number.isFinite(ys[i])) continue;
    if (best < 0 || Math.abs(xs[i] - step) < Math.abs(xs[best] - step)) best = i;
  }
  return best;
}

function drawCompareChart(st) {
  const drawn = st.lines.filter(l => l.n > 0)
    .map(l => ({ xs: l.xs, ys: l.ys, color: l.color, dots: st.spec.dots }));
  st.geom = lineChart(st.canvas, drawn, { digits: st.spec.digits, zero: st.spec.zero });
  st.canvas.dataset.jobs = String(drawn.length);
}

function swatch(color) {
  const i = el("i");
  i.style.background = color;
  return i;
}

// The cursor line at the step nearest st.hover (a fraction of the plot's width), a ring on each
// job's nearest point and the tooltip; hides the tooltip when there is no cursor or no data.
function showCursor(st) {
  const g = st.geom, tip = st.tip;
  const hide = () => { tip.hidden = true; tip.replaceChildren(); delete tip.dataset.step; };
  if (!g || st.hover === null) return hide();
  const target = g.xmin + st.hover * (g.xmax - g.xmin);
  const hits = st.lines.map(l => ({ l, i: nearestIndex(l.xs, l.ys, target) }));
  let step = null;
  for (const h of hits) {
    if (h.i < 0) continue;
    const s = h.l.xs[h.i];
    if (step === null || Math.abs(s - target) < Math.abs(step - target)) step = s;
  }
  if (step === null) return hide();
  const ctx = g.ctx;
  ctx.save();
  ctx.strokeStyle = "#1d2330"; ctx.globalAlpha = 0.55; ctx.lineWidth = 1; ctx.setLineDash([4, 3]);
  ctx.beginPath(); ctx.moveTo(g.px(step), g.T); ctx.lineTo(g.px(step), g.H - g.B); ctx.stroke();
  ctx.restore();
  for (const h of hits) {
    if (h.i < 0) continue;
    ctx.beginPath();
    ctx.arc(g.px(h.l.xs[h.i]), g.py(h.l.ys[h.i]), 3.5, 0, 2 * Math.PI);
    ctx.fillStyle = h.l.color; ctx.fill();
    ctx.strokeStyle = "#fff"; ctx.lineWidth = 1.5; ctx.stroke();
  }
  tip.replaceChildren(el("div", "step " + step, "tip-head"));
  tip.dataset.step = String(step);
  for (const h of hits) {
    const row = el("div", null, "tip-row");
    row.dataset.job = h.l.id;
    row.appendChild(swatch(h.l.color));
    row.appendChild(document.createTextNode(h.l.id + " "));
    if (h.i < 0) {
      row.classList.add("nodata");
      row.appendChild(document.createTextNode("no data"));
    } else {
      const s = h.l.xs[h.i], v = h.l.ys[h.i];
      row.dataset.step = String(s);
      row.dataset.value = String(v);
      row.appendChild(el("b", fmt(v, st.spec.digits)));
      if (s !== step) row.appendChild(document.createTextNode(` (step ${s})`));
    }
    tip.appendChild(row);
  }
  tip.hidden = false;
  // Beside the cursor, on the side with more room.
  const scale = st.canvas.getBoundingClientRect().width / st.canvas.width;
  const x = g.px(step) * scale;
  if (g.px(step) > g.W / 2) {
    tip.style.left = ""; tip.style.right = `${g.W * scale - x + 8}px`;
  } else {
    tip.style.right = ""; tip.style.left = `${x + 8}px`;
  }
}

function onChartMouse(st, ev) {
  const g = st.geom;
  if (!g) return;
  const rect = st.canvas.getBoundingClientRect();
  if (!rect.width) return;
  const x = (ev.clientX - rect.left) * st.canvas.width / rect.width;
  st.hover = Math.max(0, Math.min(1, (x - g.L) / (g.W - g.L - g.R)));
  drawCompareChart(st);
  showCursor(st);
}

// A real mousemove at `frac` of the plot's width (the &hover=F of the hash).
function hoverAt(st, frac) {
  const g = st.geom;
  if (!g) return;
  const rect = st.canvas.getBoundingClientRect();
  const x = g.L + frac * (g.W - g.L - g.R), y = (g.T + g.H - g.B) / 2;
  st.canvas.dispatchEvent(new MouseEvent("mousemove", {
    bubbles: true,
    clientX: rect.left + x * rect.width / st.canvas.width,
    clientY: rect.top + y * rect.height / st.canvas.height,
  }));
}

function renderLegend(ul, runs, lines) {
  ul.replaceChildren();
  runs.forEach((r, k) => {
    const li = el("li");
    li.dataset.job = r.id;
    li.dataset.points = String(lines[k].n);
    if (r.design) li.dataset.design = r.design;
    li.appendChild(swatch(r.color));
    let text = `${r.id} - ${r.error ? r.error : r.design || "design unknown"}`;
    if (r.error || lines[k].n === 0) li.className = "nodata";
    if (!r.error && lines[k].n === 0) text += " (no data)";
    li.appendChild(document.createTextNode(text));
    if (r.name) li.title = r.name;
    ul.appendChild(li);
  });
}

// The table above the charts: each job's latest numbers and its validation loss at the last
// step every job has evaluated (each job's newest evaluation at or before it), so that the runs
// are compared at one step; the lowest is marked "ahead".
function renderCompareTable(runs) {
  const tbody = document.querySelector("#compare-jobs tbody");
  tbody.replaceChildren();
  const evals = runs.map(r => {
    if (r.error) return [];
    const steps = column(r.series, "step"), vals = column(r.series, "val_loss");
    return steps.map((s, i) => [s, vals[i]]).filter(([, v]) => v !== null && Number.isFinite(v));
  });
  const ends = evals.filter(e => e.length).map(e => e[e.length - 1][0]);
  const common = ends.length ? Math.min(...ends) : null;
  const at = evals.map(e => {
    let v = null;
    for (const [s, x] of e) if (s <= common) v = x;
    return v;
  });
  document.getElementById("compare-val-head").textContent =
    common === null ? "validation loss" : `validation loss at step ${common}`;
  let lead = -1;
  at.forEach((v, k) => { if (v !== null && (lead < 0 || v < at[lead])) lead = k; });
  runs.forEach((r, k) => {
    const tr = el("tr");
    tr.dataset.job = r.id;
    const id = el("td");
    id.appendChild(swatch(r.color));
    const link = el("a", r.id);
    link.href = "#job=" + encodeURIComponent(r.id);
    id.appendChild(link);
    tr.appendChild(id);
    if (r.error) {
      const why = el("td", r.error, "state-FAILED");
      why.colSpan = 7;
      tr.appendChild(why);
      tbody.appendChild(tr);
      return;
    }
    const j = r.job, running = Number(j.step) > 0;
    tr.appendChild(el("td", j.name));
    tr.appendChild(el("td", r.design || ""));
    tr.appendChild(el("td", j.state, "state-" + j.state));
    tr.appendChild(el("td", `${j.step}/${j.steps}`));
    tr.appendChild(el("td", fmt(running ? j.loss : null, 4)));
    const v = el("td", fmt(at[k], 4) + (k === lead && runs.length > 1 ? " · ahead" : ""));
    if (k === lead && runs.length > 1) v.className = "ahead";
    tr.appendChild(v);
    tr.appendChild(el("td", fmt(running ? j.tokens_per_second : null, 0)));
    tbody.appendChild(tr);
  });
}

async function renderCompare(req) {
  if (compareHash !== location.hash) {  // a new selection: no cursor from the last one
    for (const st of Object.values(compareCharts)) st.hover = null;
    compareHash = location.hash;
  }
  const fetched = await Promise.all(req.ids.map(id =>
    getJson("/api/jobs/" + encodeURIComponent(id)).then(d => ({ id, d }), e => ({ id, e }))));
  if (fetched.length && fetched.every(f => f.e && !/HTTP 404/.test(f.e.message))) throw fetched[0].e;
  const runs = fetched.map((f, k) => ({
    id: f.id,
    color: COMPARE_COLORS[k % COMPARE_COLORS.length],
    error: f.e ? (/HTTP 404/.test(f.e.message) ? "not found" : f.e.message) : null,
    job: f.d ? f.d.job : null,
    name: f.d ? f.d.job.name : "",
    design: f.d ? f.d.job.design_detail || f.d.job.design || "" : "",
    series: f.d ? f.d.series : null,
  }));
  document.getElementById("compare-title").textContent = runs.length
    ? `Compare ${runs.length} job${runs.length > 1 ? "s" : ""}`
    : "Compare: tick jobs in the jobs table first";
  renderCompareTable(runs);
  for (const spec of COMPARE_CHARTS) {
    const st = compareCharts[spec.key];
    st.lines = runs.map(r => {
      const xs = r.series ? column(r.series, "step") : [];
      const ys = r.series ? column(r.series, spec.field) : [];
      const n = ys.filter(v => v !== null && Number.isFinite(v)).length;
      return { id: r.id, color: r.color, xs, ys, n };
    });
    renderLegend(document.getElementById("legend-" + spec.key), runs, st.lines);
    drawCompareChart(st);
    showCursor(st);  // the cursor stays where the mouse left it while the data refreshes
  }
  if (req.hover !== null) {
    for (const spec of COMPARE_CHARTS) hoverAt(compareCharts[spec.key], req.hover);
  }
}

// ---- wiring (the elements exist: the scripts load at the end of the body) ----

for (const spec of COMPARE_CHARTS) {
  const st = {
    spec,
    canvas: document.getElementById("cmp-chart-" + spec.key),
    tip: document.getElementById("tip-" + spec.key),
    lines: [], geom: null, hover: null,
  };
  compareCharts[spec.key] = st;
  st.canvas.addEventListener("mousemove", ev => onChartMouse(st, ev));
  st.canvas.addEventListener("mouseleave", () => { st.hover = null; drawCompareChart(st); showCursor(st); });
}
document.getElementById("compare-button").addEventListener("click", () => {
  if (comparePicked.size) location.hash = "#compare=" + [...comparePicked].map(encodeURIComponent).join(",");
});
