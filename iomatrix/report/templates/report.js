// iomatrix report: draws the charts and paged tables of the page from the embedded run data.
// Charts are drawn one per task, those nearest the viewport first, so the page stays usable while
// the rest are drawn; <html data-charts> is "drawing" until every chart is drawn, then "ready"
// ("error" when the page's data cannot be unpacked).
// The run's data and plotly.js are embedded gzip+base85: unpack.js unpacks them.
(async () => {
  "use strict";
  const D = JSON.parse(await withPlotly("report-data"));
  // IOPS, bandwidth and the latencies as iomatrix.analysis.metrics defines them, by key.
  const FIGURES = JSON.parse(document.getElementById("report-metrics").textContent);
  const FIGURE = Object.fromEntries(FIGURES.map((f) => [f.key, f]));
  const root = document.documentElement;
  // Timings since navigation started, for the benchmark: script start, first chart drawn, every
  // chart near the viewport drawn, every chart drawn.
  root.dataset.scriptStartMs = String(Math.round(performance.now()));
  const configs = D.configs;
  const workloads = D.workloads ?? [];
  const groups = D.groups ?? [];
  // Points come as a table (columns + rows, null for a default): objects with only the fields set.
  const points = D.points.rows.map((row) => {
    const p = {};
    D.points.columns.forEach((name, i) => { if (row[i] !== null) p[name] = row[i]; });
    return p;
  });
  const axes = D.axes ?? {};
  const MISSING = "—";
  const DENSE_POINTS = 400;
  const LEGEND_UNDER = 12;
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  const DASHES = ["solid", "dash", "dot", "dashdot"];
  const FONT = getComputedStyle(document.body).fontFamily;
  const PLOT_CONFIG = {displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"]};

  // --- formatting --------------------------------------------------------------------------------
  const fin = (v) => (typeof v === "number" && Number.isFinite(v)) ? v : null;
  const FORMATS = [0, 1, 2, 3].map((d) => new Intl.NumberFormat("en-US", {minimumFractionDigits: d, maximumFractionDigits: d}));
  const fmt = (v, digits = 0) => {
    v = fin(v);
    return v === null ? MISSING : FORMATS[digits].format(v);
  };
  // A figure with `significant` significant digits but every digit of its whole part: the rule of
  // iomatrix.analysis.metrics.figure_text (12345.6 -> "12,346", 2.657 -> "2.66", 0.009766 -> "0.00977").
  const SIG_FORMATS = [];
  const sig = (v, significant = 3) => {
    v = fin(v);
    if (v === null) return MISSING;
    if (v === 0) return "0";
    const magnitude = Math.floor(Math.log10(Math.abs(Number(v.toPrecision(significant)))));
    const d = Math.max(0, significant - 1 - magnitude);
    SIG_FORMATS[d] ??= new Intl.NumberFormat("en-US", {minimumFractionDigits: d, maximumFractionDigits: d});
    return SIG_FORMATS[d].format(v);
  };
  const scaled = (v, by) => (fin(v) === null ? null : v / by);
  const esc = (s) => String(s).replace(/[&<>"']/g,
    (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
  const target = D.quality.ci_target;
  const flagText = (p) => (p.flags ?? []).map((flag) => {
    if (flag === "steady") {
      const checked = p.steady_checked ?? 0, missed = checked - (p.steady_reached ?? 0);
      return `steady state not reached in ${missed} of ${plural(checked, "sample")}`;
    }
    if (flag === "ci") return `95 % CI ±${fmt(p.ci_relative * 100, 1)} % of the mean, above the ${+(target * 100).toPrecision(6)} % target`;
    if (flag === "failed") return plural(p.failed ?? 0, "failed sample");
    if (flag === "ram") return "served from RAM: less than half of fio's bytes reached the device (host page cache)";
    if (flag === "bare") return "faster than this run's bare metal: a cache answered, not the storage";
    if (flag === "stalled") return `${plural(p.stalled ?? 0, "stalled trial")}: a second or more without a completion`;
    return flag;
  });
  const pctSigned = (v) => (v >= 0 ? "+" : "\u2212") + Math.abs(v).toFixed(1) + " %";

  // --- indexes -----------------------------------------------------------------------------------
  const byGroup = groups.map(() => []);
  const byWorkload = workloads.map(() => []);
  for (const p of points) {
    byGroup[workloads[p.workload].group].push(p);
    byWorkload[p.workload].push(p);
  }
  const tcg = configs.map((c) => c.accelerator === "tcg");

  // --- the configuration filter and the colouring (the toolbar) -----------------------------------
  const filter = {};
  for (const box of document.querySelectorAll("#toolbar input[data-axis]")) {
    (filter[box.dataset.axis] ??= new Set()).add(box.value);
  }
  const valueOf = (c, axis) => (axis === "mode" ? c.mode : c.params[axis]);
  let shownMask = [];
  function computeShown() {
    shownMask = configs.map((c) => Object.entries(filter).every(([axis, set]) => {
      const v = valueOf(c, axis);
      return v === undefined || set.has(v);
    }));
    const count = document.getElementById("shown-count");
    if (count) count.textContent = `${shownMask.filter(Boolean).length} of ${configs.length} configurations shown`;
  }
  computeShown();
  const colorSelect = document.getElementById("color-by");
  let colorBy = colorSelect ? colorSelect.value : "configuration";

  // Lines of one colour: one per configuration, or one per level of the colouring axis (several
  // configurations drawn as one trace, separated by gaps: far fewer traces to draw).
  function seriesOf(ci) {
    const c = configs[ci];
    if (colorBy === "configuration") return {key: "c" + ci, name: c.label, index: ci};
    const v = valueOf(c, colorBy);
    const levels = axes[colorBy] ?? [];
    if (v === undefined) {
      const name = c.mode === "host" ? "host (bare metal)" : `${c.mode} (no ${colorBy})`;
      return {key: "m" + c.mode, name, index: levels.length + ["host", "blocklayer", "guest"].indexOf(c.mode) + 1};
    }
    return {key: "v" + v, name: `${colorBy}=${v}`, index: levels.indexOf(v)};
  }
  function styleOf(index) {
    return {color: PALETTE[index % PALETTE.length],
            dash: DASHES[Math.floor(index / PALETTE.length) % DASHES.length]};
  }

  // --- charts ------------------------------------------------------------------------------------
  const bareText = (p) => p.iops_pct == null ? "" : (p.bare_significant == null ? " (untested: n<2)"
    : p.bare_significant ? "" : " (no significant difference)");
  // A figure's chart, by its stem: the mean and 95 % CI fields of a point are KEY, STEM_low, STEM_high.
  const figureChart = (f) => ({title: f.title, axis: f.axis, y: (p) => scaled(p[f.key], f.scale),
                               lo: (p) => scaled(p[f.stem + "_low"], f.scale), hi: (p) => scaled(p[f.stem + "_high"], f.scale),
                               show: (v) => sig(v, f.significant) + " " + f.unit});
  const METRICS = {
    ...Object.fromEntries(FIGURES.map((f) => [f.stem, figureChart(f)])),
    cpu: {title: "Host CPU per I/O", axis: "CPU µs per I/O", y: (p) => p.cpu_us_per_io,
          show: (v) => fmt(v, 2) + " µs CPU per I/O", extra: (p) => p.csw_per_io == null ? ""
            : `<br>${fmt(p.csw_per_io, 3)} context switches per I/O` + (p.cycles_per_io == null ? "" : `<br>${fmt(p.cycles_per_io)} cycles per I/O`)},
    bare_iops: {title: "IOPS as % of bare metal", axis: "% of bare-metal IOPS", y: (p) => p.iops_pct,
                show: (v) => fmt(v, 1) + " % of bare metal", extra: bareText, reference: 100,
                open: (p) => p.bare_significant !== true},
    bare_lat: {title: "Latency added to bare metal", axis: "µs added to the bare-metal mean latency",
               y: (p) => p.added_lat_us, show: (v) => fmt(v, 1) + " µs added",
               extra: (p) => (p.added_p99_us == null ? "" : `<br>p99: ${fmt(p.added_p99_us, 1)} µs added`)
                 + "<br>not tested for significance: compare the latency CIs",
               reference: 0, signed: true, lower: true},
  };

  function baseLayout(el, title, traceNames, height = 300) {
    // The legend lists one entry a line under the x axis (room for exactly that many lines); past
    // LEGEND_UNDER entries it goes to the right, where plotly scrolls it.
    const n = traceNames.length;
    const right = n > LEGEND_UNDER;
    const bottom = right ? 60 : 60 + 19 * n;
    return {
      title: {text: title, font: {size: 14}, x: 0.01, xanchor: "left"},
      height: height + bottom,
      margin: {l: 70, r: right ? Math.min(360, 40 + 6.5 * Math.max(...traceNames.map((t) => t.length))) : 20, t: 44, b: bottom},
      font: {family: FONT, size: 12},
      legend: right ? {orientation: "v", x: 1.02, xanchor: "left", y: 1, yanchor: "top"}
        : {orientation: "v", x: 0, xanchor: "left", yref: "container", y: 0, yanchor: "bottom"},
      showlegend: true, annotations: [], shapes: [],
      paper_bgcolor: "#fff", plot_bgcolor: "#fff",
    };
  }
  function note(layout, text, color = "#59636e") {
    layout.annotations.push({text, showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5,
                             font: {color}});
  }
  function tcgNote(layout, anyTcg, what = "lines measure") {
    if (anyTcg) {
      layout.annotations.push({text: `[emulated: TCG] ${what} the emulator`, showarrow: false,
                               xref: "paper", yref: "paper", x: 1, y: 1, xanchor: "right", yanchor: "bottom",
                               font: {color: "#cf222e", size: 11}});
    }
  }
  function depthAxis(depths) {
    const log = depths.length > 2;
    return {title: {text: "iodepth" + (log ? " (log₂ scale)" : ""), standoff: 8}, type: log ? "log" : "linear",
            tickvals: depths, ticktext: depths.map(String), zeroline: false, automargin: true};
  }
  function hoverFor(p, m, y) {
    const w = workloads[p.workload];
    let text = `<b>${esc(configs[p.config].label)}</b><br>${esc(w.label)}: ${m.show(y)}`;
    const lo = m.lo ? fin(m.lo(p)) : null, hi = m.hi ? fin(m.hi(p)) : null;
    if (lo !== null && hi !== null) text += `<br>95 % CI ${m.show(lo)} … ${m.show(hi)}`;
    if (m.extra) text += m.extra(p);
    text += `<br>${plural(p.samples, "sample")}` + (p.failed ? `, ${p.failed} failed` : "");
    for (const flag of flagText(p)) text += `<br>⚠ ${esc(flag)}`;
    return text;
  }

  // Lines of one metric against the queue depth, for one workload group.
  function drawQd(el) {
    const m = METRICS[el.dataset.metric];
    const g = Number(el.dataset.group);
    const all = byGroup[g];
    const depths = [...new Set(all.map((p) => workloads[p.workload].iodepth))].sort((a, b) => a - b);
    const perConfig = new Map();
    for (const p of all) {
      if (!shownMask[p.config] || fin(m.y(p)) === null) continue;
      if (!perConfig.has(p.config)) perConfig.set(p.config, []);
      perConfig.get(p.config).push(p);
    }
    const series = new Map();
    for (const [ci, pts] of [...perConfig.entries()].sort((a, b) => a[0] - b[0])) {
      const s = seriesOf(ci);
      if (!series.has(s.key)) series.set(s.key, {...s, pts: [], tcg: false});
      const entry = series.get(s.key);
      if (entry.pts.length) entry.pts.push(null);   // a gap between two configurations' lines
      pts.sort((a, b) => workloads[a.workload].iodepth - workloads[b.workload].iodepth);
      entry.pts.push(...pts);
      entry.tcg ||= tcg[ci];
    }
    // Past DENSE_POINTS markers the drawing time is mostly markers: draw lines only, and the
    // flagged points as one trace of crosses on top.
    const dense = [...perConfig.values()].reduce((n, pts) => n + pts.length, 0) > DENSE_POINTS;
    const flagged = {x: [], y: [], text: []};
    const traces = [...series.values()].sort((a, b) => a.index - b.index).map((s) => {
      const st = styleOf(s.index);
      const x = [], y = [], plus = [], minus = [], text = [], symbol = [], size = [];
      let hasCi = false;
      for (const p of s.pts) {
        if (p === null) { x.push(null); y.push(null); plus.push(null); minus.push(null); text.push(""); symbol.push("circle"); size.push(0); continue; }
        const v = m.y(p);
        const lo = m.lo ? fin(m.lo(p)) : null, hi = m.hi ? fin(m.hi(p)) : null;
        x.push(workloads[p.workload].iodepth); y.push(v);
        plus.push(hi === null ? null : hi - v); minus.push(lo === null ? null : v - lo);
        hasCi ||= hi !== null;
        text.push(hoverFor(p, m, v));
        const isFlagged = (p.flags ?? []).length > 0;
        symbol.push((isFlagged ? "x" : "circle") + (m.open && m.open(p) ? "-open" : "")); size.push(isFlagged ? 10 : 7);
        if (dense && isFlagged) { flagged.x.push(x[x.length - 1]); flagged.y.push(v); flagged.text.push(text[text.length - 1]); }
      }
      const name = s.name + (s.tcg && colorBy !== "configuration" ? " [emulated: TCG]" : "");
      const trace = {type: "scatter", mode: dense ? "lines" : "lines+markers", name, x, y, connectgaps: false,
                     line: {color: st.color, width: dense ? 1.2 : 2, dash: st.dash},
                     hovertext: text, hovertemplate: "%{hovertext}<extra></extra>"};
      if (!dense) trace.marker = {color: st.color, size, symbol};
      if (hasCi) trace.error_y = {type: "data", symmetric: false, array: plus, arrayminus: minus, visible: true,
                                  thickness: 1.2, width: 3, color: st.color};
      return trace;
    });
    if (flagged.x.length) {
      traces.push({type: "scatter", mode: "markers", name: "✕ flagged point", x: flagged.x, y: flagged.y,
                   marker: {symbol: "x", size: 7, color: "#444"}, hovertext: flagged.text,
                   hovertemplate: "%{hovertext}<extra></extra>"});
    }
    const layout = baseLayout(el, `${m.title} · ${groups[g].title}`, traces.map((t) => t.name));
    layout.xaxis = depthAxis(depths);
    layout.yaxis = {title: {text: m.axis}, rangemode: m.signed ? "normal" : "tozero", separatethousands: true, automargin: true};
    if (m.reference !== undefined && traces.length) {
      layout.shapes.push({type: "line", xref: "paper", x0: 0, x1: 1, y0: m.reference, y1: m.reference,
                          line: {color: "#59636e", width: 1, dash: "dot"}});
    }
    if (!traces.length) note(layout, perConfig.size === 0 && all.some((p) => shownMask[p.config]) ? "no measured values" : "no configuration shown");
    tcgNote(layout, traces.some((t) => t.name.includes("[emulated: TCG]")));
    return Plotly.react(el, traces, layout, PLOT_CONFIG);
  }

  // Gains of one axis per queue depth: bars with CI error bars, non-significant ones marked.
  const gainMetric = document.getElementById("gain-metric");
  function drawGain(el) {
    const metric = gainMetric.value;
    const hold = el.dataset.hold;
    const set = (D.gains ?? []).find((s) => s.axis === el.dataset.axis && (s.hold ?? []).join(",") === hold && s.metric === metric);
    const title = `${FIGURE[metric].title}: ${el.dataset.axis}` + (set ? ` vs ${el.dataset.axis}=${set.reference}` : "")
      + (hold ? ` · per ${hold.split(",").join(", ")}` : " · pooled over the other axes");
    const traces = [];
    const depths = [];
    if (set) {
      const bySeries = new Map();
      for (const gain of set.gains) {
        const held = Object.entries(gain.held ?? {}).map(([k, v]) => `${k}=${v}`).join(", ");
        const key = gain.level + "|" + held;
        if (!bySeries.has(key)) bySeries.set(key, {name: `${el.dataset.axis}=${gain.level}` + (held ? ` · ${held}` : ""), gains: []});
        bySeries.get(key).gains.push(gain);
        const qd = gain.iodepth == null ? "all" : "QD" + gain.iodepth;
        if (!depths.includes(qd)) depths.push(qd);
      }
      let index = 0;
      for (const s of bySeries.values()) {
        const color = PALETTE[index++ % PALETTE.length];
        const x = [], y = [], plus = [], minus = [], text = [], hover = [], opacity = [], pattern = [];
        for (const gain of s.gains) {
          const rel = fin(gain.relative);
          const v = rel === null ? null : rel * 100;
          x.push(gain.iodepth == null ? "all" : "QD" + gain.iodepth); y.push(v);
          plus.push(v === null || fin(gain.high) === null ? null : gain.high * 100 - v);
          minus.push(v === null || fin(gain.low) === null ? null : v - gain.low * 100);
          const significant = !!gain.significant;
          text.push(v === null ? "no estimate" : significant ? "" : "n.s.");
          opacity.push(significant ? 1 : 0.4);
          pattern.push(significant ? "" : "/");
          hover.push(`<b>${esc(s.name)}</b> vs ${esc(set.reference)}, ${x[x.length - 1]}<br>`
            + (v === null ? "no estimate" : pctSigned(v)) + `<br>${esc(gain.verdict)}<br>${plural(gain.pairs, "matched pair")}`
            + (gain.method ? `<br>${esc(gain.method)}` : "")
            + (fin(gain.mde) === null ? "" : `<br>minimal detectable effect ±${(gain.mde * 100).toFixed(1)} %`)
            + (fin(gain.noise_floor) === null ? "" : `<br>noise floor (A/A) ±${(gain.noise_floor * 100).toFixed(1)} %`));
        }
        traces.push({type: "bar", name: s.name, x, y, text, textposition: "outside", cliponaxis: false,
                     marker: {color, opacity, pattern: {shape: pattern, solidity: 0.3}},
                     error_y: {type: "data", symmetric: false, array: plus, arrayminus: minus, visible: true,
                               thickness: 1.2, width: 3, color: "#444"},
                     hovertext: hover, hovertemplate: "%{hovertext}<extra></extra>"});
      }
    }
    const layout = baseLayout(el, title, traces.map((t) => t.name));
    layout.barmode = "group";
    layout.xaxis = {type: "category", categoryarray: depths, title: {text: "iodepth", standoff: 8}, automargin: true};
    const lower = FIGURE[metric].lower_is_better;
    layout.yaxis = {title: {text: "% change" + (lower ? " (negative = lower latency, better)" : " (positive = better)")},
                    zeroline: true, zerolinecolor: "#59636e", ticksuffix: " %", automargin: true};
    if (!traces.length) note(layout, "no matched pairs for this metric");
    const floor = set ? fin((set.gains[0] ?? {}).noise_floor) : null;
    if (floor !== null) {
      // the A/A noise floor: a gain inside this band is indistinguishable from measuring twice
      layout.shapes = [{type: "rect", xref: "paper", x0: 0, x1: 1, y0: -floor * 100, y1: floor * 100,
                        fillcolor: "#8c959f", opacity: 0.15, line: {width: 0}, layer: "below"}];
    }
    tcgNote(layout, D.emulated, "gains measure");
    return Plotly.react(el, traces, layout, PLOT_CONFIG);
  }

  // Host CPU per I/O by role for one workload, one stacked bar per configuration.
  function selected(target) {
    const select = document.querySelector(`select.workload-select[data-target="${target}"]`);
    return select ? Number(select.value) : 0;
  }
  function drawRoles(el) {
    const wi = selected("chart-roles");
    const pts = byWorkload[wi].filter((p) => shownMask[p.config] && p.cpu_roles && Object.keys(p.cpu_roles).length)
      .sort((a, b) => b.config - a.config);
    const roles = [...new Set(pts.flatMap((p) => Object.keys(p.cpu_roles)))];
    const labels = pts.map((p) => configs[p.config].label);
    const traces = roles.map((role, i) => ({
      type: "bar", orientation: "h", name: role, y: labels, x: pts.map((p) => fin(p.cpu_roles[role]) ?? 0),
      marker: {color: PALETTE[i % PALETTE.length]},
      hovertext: pts.map((p) => `<b>${esc(configs[p.config].label)}</b><br>${esc(role)}: ${p.cpu_roles[role] == null ? "not recorded" : fmt(p.cpu_roles[role], 2) + " µs per I/O"}`
        + `<br>all roles: ${fmt(p.cpu_us_per_io, 2)} µs per I/O`),
      hovertemplate: "%{hovertext}<extra></extra>",
    }));
    const layout = baseLayout(el, `Host CPU µs per I/O by role · ${workloads[wi]?.label ?? ""}`, roles, Math.max(220, 24 * labels.length + 40));
    layout.barmode = "stack";
    layout.xaxis = {title: {text: "CPU µs per I/O"}, rangemode: "tozero", automargin: true};
    layout.yaxis = {automargin: true, type: "category"};
    if (!traces.length) note(layout, "no CPU cost recorded for this workload");
    tcgNote(layout, pts.some((p) => tcg[p.config]), "bars measure");
    return Plotly.react(el, traces, layout, PLOT_CONFIG);
  }

  // One line per configuration family against the number of VMs (or, with data-axis, against a
  // lever: IOThreads or queues per disk, ReportData's LEVERS), for one workload.
  const LEVER_TITLES = {iothreads: ["IOThreads per disk", "IOThreads per disk (0: none)"],
                        num_queues: ["queues per disk", "queues (num_queues)"]};
  function drawScale(el) {
    const m = METRICS[el.dataset.metric];
    const lever = el.dataset.axis;
    const wi = selected(lever ? "levers" : "scaling");
    const placeOf = lever ? (c) => c.levers?.[lever] ?? null
      : (c) => (c.family ? {family: c.family, level: Number(c.params.vms)} : null);
    const families = new Map();
    for (const p of byWorkload[wi]) {
      const at = placeOf(configs[p.config]);
      if (!at || !shownMask[p.config] || fin(m.y(p)) === null) continue;
      if (!families.has(at.family)) families.set(at.family, []);
      families.get(at.family).push(p);
    }
    const xOf = (p) => placeOf(configs[p.config]).level;
    const allX = new Set();
    const traces = [...families.entries()].map(([family, pts], i) => {
      pts.sort((a, b) => xOf(a) - xOf(b));
      const st = styleOf(i);
      const y = pts.map((p) => m.y(p));
      const lo = pts.map((p) => (m.lo ? fin(m.lo(p)) : null)), hi = pts.map((p) => (m.hi ? fin(m.hi(p)) : null));
      pts.forEach((p) => allX.add(xOf(p)));
      const trace = {type: "scatter", mode: "lines+markers", name: family, x: pts.map(xOf), y,
                     line: {color: st.color, width: 2, dash: st.dash},
                     marker: {color: st.color, size: pts.map((p) => ((p.flags ?? []).length ? 10 : 6)),
                              symbol: pts.map((p) => ((p.flags ?? []).length ? "x" : "circle"))},
                     hovertext: pts.map((p, k) => {
                       let text = hoverFor(p, m, y[k]);
                       const vm = p.vm_iops ?? [];
                       if (vm.length) text += `<br>per guest: ${fmt(Math.min(...vm))} … ${fmt(Math.max(...vm))} IOPS`;
                       return text;
                     }),
                     hovertemplate: "%{hovertext}<extra></extra>"};
      if (hi.some((v) => v !== null)) {
        trace.error_y = {type: "data", symmetric: false, visible: true, thickness: 1.2, width: 3, color: st.color,
                         array: hi.map((v, k) => (v === null ? null : v - y[k])),
                         arrayminus: lo.map((v, k) => (v === null ? null : y[k] - v))};
      }
      return trace;
    });
    const xs = [...allX].sort((a, b) => a - b);
    const [what, xTitle] = lever ? LEVER_TITLES[lever] ?? [lever, lever] : ["number of VMs", "VMs at once"];
    const layout = baseLayout(el, `${m.title} vs ${what} · ${workloads[wi]?.label ?? ""}`, traces.map((t) => t.name));
    layout.xaxis = {title: {text: xTitle}, tickvals: xs, ticktext: xs.map(String), automargin: true};
    layout.yaxis = {title: {text: m.axis}, rangemode: "tozero", separatethousands: true, automargin: true};
    if (!traces.length) note(layout, lever ? `no configuration of this workload has a level of ${lever}` + (m === METRICS.cpu ? " with its CPU measured" : "")
      : "no configuration of this workload has a VM count");
    tcgNote(layout, traces.some((t) => t.name.includes("[emulated: TCG]")));
    return Plotly.react(el, traces, layout, PLOT_CONFIG);
  }

  // A cluster-load run's curve against the number of nodes ([matrix] node_count): aggregate and
  // per-node IOPS with their 95 % CI, N x the one-node figure (perfect scaling), and where adding
  // a node stops adding IOPS (iomatrix.analysis.scaling).
  function drawNodes(el) {
    const c = (D.node_scaling ?? [])[selected("chart-nodes")];
    if (!c) return Plotly.react(el, [], baseLayout(el, "no scaling curve", []), PLOT_CONFIG);
    const xs = c.rows.map((r) => r.nodes);
    const bars = (fs) => ({type: "data", symmetric: false, visible: true, thickness: 1.2, width: 3,
                           array: fs.map((f) => (f.high != null ? f.high - f.mean : null)),
                           arrayminus: fs.map((f) => (f.low != null ? f.mean - f.low : null))});
    const hover = (fs, what) => fs.map((f, k) => `${plural(xs[k], "node")}: ${fmt(f.mean)} ${what}`
      + (f.low != null ? ` (95 % CI ${fmt(f.low)} … ${fmt(f.high)})` : " (one round: no CI)")
      + (c.rows[k].efficiency ? `<br>aggregate / (N × one node): ${fmt(100 * c.rows[k].efficiency.mean)} %` : ""));
    const line = (name, fs, what, color) => ({type: "scatter", mode: "lines+markers", name, x: xs,
      y: fs.map((f) => f.mean), error_y: bars(fs), line: {color, width: 2}, marker: {color, size: 7},
      hovertext: hover(fs, what), hovertemplate: "%{hovertext}<extra></extra>"});
    const traces = [line("aggregate IOPS (all nodes)", c.rows.map((r) => r.aggregate_iops), "IOPS in all", PALETTE[0]),
                    line("IOPS per node", c.rows.map((r) => r.per_node_iops), "IOPS per node", PALETTE[1])];
    const one = c.rows.find((r) => r.nodes === 1);
    if (one) {
      traces.push({type: "scatter", mode: "lines", name: "N × one node (perfect scaling)", x: xs,
                   y: xs.map((n) => n * one.aggregate_iops.mean), line: {color: "#7f7f7f", width: 1.5, dash: "dash"},
                   hoverinfo: "skip"});
    }
    const layout = baseLayout(el, `IOPS vs number of nodes · ${c.family} · ${c.workload_label}`, traces.map((t) => t.name));
    layout.xaxis = {title: {text: "nodes loading the target at once"}, tickvals: xs, ticktext: xs.map(String), automargin: true};
    layout.yaxis = {title: {text: "IOPS"}, rangemode: "tozero", separatethousands: true, automargin: true};
    if (c.saturates_at != null) {
      layout.shapes = [{type: "line", x0: c.saturates_at, x1: c.saturates_at, yref: "paper", y0: 0, y1: 1,
                        line: {color: "#cf222e", width: 1, dash: "dot"}}];
      layout.annotations.push({text: "adding nodes stops adding IOPS", x: c.saturates_at, yref: "paper", y: 1,
                               showarrow: false, xanchor: "left", font: {color: "#cf222e", size: 11}});
    }
    tcgNote(layout, c.family.includes("[emulated: TCG]"));
    return Plotly.react(el, traces, layout, PLOT_CONFIG);
  }

  const DRAW = {qd: drawQd, gain: drawGain, roles: drawRoles, scale: drawScale, nodes: drawNodes};

  // --- drawing schedule: visible charts first, one per task ---------------------------------------
  const charts = [...document.querySelectorAll(".chart")];
  const pending = new Set(charts);
  const near = new Set();
  let busy = false;
  let drawnOnce = 0;
  function pump() {
    if (busy) return;
    if (!pending.size) {
      root.dataset.charts = "ready";
      root.dataset.allChartsMs ??= String(Math.round(performance.now()));
      return;
    }
    root.dataset.charts = "drawing";
    let el = charts.find((c) => pending.has(c) && near.has(c));
    if (!el) {
      if (drawnOnce) root.dataset.viewportChartsMs ??= String(Math.round(performance.now()));
      el = charts.find((c) => pending.has(c));
    }
    pending.delete(el);
    busy = true;
    const start = performance.now();
    Promise.resolve()
      .then(() => DRAW[el.dataset.kind](el))
      .then(() => {
        el.dataset.drawn = "1";
        el.dataset.drawOrder ??= String(drawnOnce);
        el.dataset.drawMs = String(Math.round(performance.now() - start));
        if (!drawnOnce++) root.dataset.firstChartMs = String(Math.round(performance.now()));
      }, (err) => {
        el.dataset.drawn = "error";
        console.error("iomatrix: chart drawing failed", el.dataset.testid, err);
      })
      .finally(() => { busy = false; setTimeout(pump, 0); });
  }
  function redraw(selector) {
    for (const el of charts) if (el.matches(selector)) pending.add(el);
    delete root.dataset.allChartsMs;
    root.dataset.charts = "drawing";
    pump();
  }
  if ("IntersectionObserver" in window) {
    const watcher = new IntersectionObserver((entries) => {
      for (const e of entries) { if (e.isIntersecting) near.add(e.target); else near.delete(e.target); }
    }, {rootMargin: "600px 0px"});
    charts.forEach((c) => watcher.observe(c));
  }

  // --- paged, sortable tables --------------------------------------------------------------------
  function pagedTable(host, {columns, rows, pageSize = 100, testid, rowTestid}) {
    let sortBy = null, descending = false, page = 0;
    function render() {
      let data = rows();
      if (sortBy !== null) {
        const col = columns[sortBy];
        const key = col.sort ?? col.value;
        data = data.map((r) => [key(r), r]).sort((a, b) => {
          const x = a[0], y = b[0];
          if (x === y) return 0;
          if (x === null || x === undefined) return 1;
          if (y === null || y === undefined) return -1;
          return (x < y ? -1 : 1) * (descending ? -1 : 1);
        }).map((pair) => pair[1]);
      }
      const pages = Math.max(1, Math.ceil(data.length / pageSize));
      page = Math.min(page, pages - 1);
      const slice = data.slice(page * pageSize, (page + 1) * pageSize);
      const head = columns.map((c, i) => `<th class="sortable${c.num ? " num" : ""}" data-col="${i}">${esc(c.title)}`
        + (sortBy === i ? (descending ? " ▼" : " ▲") : "") + "</th>").join("");
      const body = slice.map((r) => `<tr data-testid="${rowTestid}">` + columns.map((c) => {
        const text = c.text ? c.text(r) : fmt(c.value(r), c.digits ?? 0);
        const classes = [c.num ? "num" : "", text === MISSING ? "missing" : "", c.cls ? c.cls(r) : ""].filter(Boolean).join(" ");
        return `<td${classes ? ` class="${classes}"` : ""}>${esc(text)}</td>`;
      }).join("") + "</tr>").join("");
      host.innerHTML = `<div class="pager">`
        + `<button type="button" data-page="prev"${page === 0 ? " disabled" : ""}>‹ previous</button>`
        + `<span>page ${page + 1} of ${pages} · ${fmt(data.length)} rows</span>`
        + `<button type="button" data-page="next"${page >= pages - 1 ? " disabled" : ""}>next ›</button></div>`
        + `<div class="wide"><table data-testid="${testid}"><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table></div>`;
    }
    host.addEventListener("click", (e) => {
      const th = e.target.closest("th[data-col]");
      if (th) {
        const i = Number(th.dataset.col);
        descending = sortBy === i ? !descending : false;
        sortBy = i;
        render();
        return;
      }
      const button = e.target.closest("button[data-page]");
      if (button) { page += button.dataset.page === "next" ? 1 : -1; page = Math.max(0, page); render(); }
    });
    render();
    return {render, reset() { page = 0; render(); }};
  }

  const hasRate = workloads.some((w) => w.rate_iops != null);
  const hasCpu = points.some((p) => p.cpu_us_per_io != null);
  const hasBare = points.some((p) => p.iops_pct != null);
  const hasSteady = points.some((p) => p.steady_checked);
  const w = (p) => workloads[p.workload];
  const figureColumn = (f, key = f.key, title = f.heading) => ({title, num: true, value: (p) => scaled(p[key], f.scale),
                                                             text: (p) => sig(scaled(p[key], f.scale), f.significant)});
  // Percentile columns: p50 has no metric of its own (no CI), and a mixed workload's are per direction.
  const P99 = FIGURE.lat_p99_ns, P50_TITLE = P99.heading.replace("p99", "p50");
  const hasMixed = points.some((p) => p.read_lat_p99_ns != null || p.write_lat_p99_ns != null
                                      || p.read_lat_p50_ns != null || p.write_lat_p50_ns != null);
  const directionColumns = hasMixed ? ["read", "write"].flatMap((d) => [
    figureColumn(P99, `${d}_lat_p50_ns`, `${d} ${P50_TITLE}`), figureColumn(P99, `${d}_lat_p99_ns`, `${d} ${P99.heading}`)]) : [];
  const pointColumns = [
    {title: "configuration", text: (p) => configs[p.config].label, sort: (p) => p.config, cls: () => "label"},
    {title: "mode", text: (p) => configs[p.config].mode},
    {title: "rw", text: (p) => w(p).rw},
    {title: "bs", num: true, text: (p) => w(p).bs_label, sort: (p) => w(p).bs},
    {title: "iodepth", num: true, value: (p) => w(p).iodepth},
    {title: "jobs", num: true, value: (p) => w(p).numjobs},
    ...(hasRate ? [{title: "rate (IOPS)", num: true, value: (p) => w(p).rate_iops ?? null}] : []),
    {title: "samples", num: true, text: (p) => String(p.samples) + (p.failed ? ` (${p.failed} failed)` : ""),
     sort: (p) => p.samples, cls: (p) => (p.failed ? "failed" : "")},
    figureColumn(FIGURE.iops),
    {title: "IOPS ±", num: true, value: (p) => p.ci_relative ?? null,
     text: (p) => (p.ci_relative == null ? MISSING : fmt(p.ci_relative * 100, 1) + " %")},
    figureColumn(FIGURE.bw_bytes),
    figureColumn(FIGURE.lat_mean_ns),
    figureColumn(P99, "lat_p50_ns", P50_TITLE),
    figureColumn(P99),
    ...directionColumns,
    {title: "usr %", num: true, value: (p) => p.usr_cpu ?? null, digits: 1},
    {title: "sys %", num: true, value: (p) => p.sys_cpu ?? null, digits: 1},
    ...(hasCpu ? [{title: "CPU µs/I/O", num: true, value: (p) => p.cpu_us_per_io ?? null, digits: 2}] : []),
    ...(hasBare ? [{title: "bare %", num: true, value: (p) => p.iops_pct ?? null,
                    text: (p) => (p.iops_pct == null ? MISSING : fmt(p.iops_pct, 1) + bareText(p))}] : []),
    ...(hasSteady ? [{title: "steady", num: true, value: (p) => (p.steady_checked ? (p.steady_reached ?? 0) / p.steady_checked : null),
                      text: (p) => (p.steady_checked ? `${p.steady_reached ?? 0}/${p.steady_checked}` : MISSING)}] : []),
    {title: "flags", text: (p) => flagText(p).join("; "), sort: (p) => (p.flags ?? []).length || null, cls: () => "flag"},
  ];
  const onlyFlagged = document.getElementById("only-flagged");
  const pointsCount = document.getElementById("points-count");
  const pointsTable = pagedTable(document.getElementById("points-table"), {
    columns: pointColumns, testid: "points-table", rowTestid: "point-row",
    rows: () => {
      const rows = points.filter((p) => shownMask[p.config] && (!onlyFlagged.checked || (p.flags ?? []).length));
      pointsCount.textContent = `${fmt(rows.length)} of ${fmt(points.length)} points`;
      return rows;
    },
  });
  onlyFlagged.addEventListener("change", () => pointsTable.reset());
  const showFlagged = document.getElementById("show-flagged");
  if (showFlagged) showFlagged.addEventListener("click", () => { onlyFlagged.checked = true; pointsTable.reset(); });

  const failuresHost = document.getElementById("failures-table");
  if (failuresHost) {
    pagedTable(failuresHost, {
      testid: "failures-table", rowTestid: "failure-row", rows: () => D.failures ?? [],
      columns: [
        {title: "configuration", text: (f) => configs[f.config].label, sort: (f) => f.config},
        {title: "workload", text: (f) => workloads[f.workload].label, sort: (f) => f.workload},
        {title: "sample", num: true, value: (f) => f.sample_index + 1},
        {title: "reason", text: (f) => f.reason},
      ],
    });
  }

  // --- controls ----------------------------------------------------------------------------------
  const toolbar = document.getElementById("toolbar");
  if (toolbar) {
    toolbar.addEventListener("change", (e) => {
      const box = e.target;
      if (box.matches("input[data-axis]")) {
        if (box.checked) filter[box.dataset.axis].add(box.value); else filter[box.dataset.axis].delete(box.value);
        computeShown();
        pointsTable.reset();
        redraw('.chart[data-kind="qd"], .chart[data-kind="roles"], .chart[data-kind="scale"]');
      } else if (box === colorSelect) {
        colorBy = colorSelect.value;
        redraw('.chart[data-kind="qd"]');
      }
    });
  }
  if (gainMetric) gainMetric.addEventListener("change", () => redraw('.chart[data-kind="gain"]'));
  for (const select of document.querySelectorAll("select.workload-select")) {
    select.addEventListener("change", () => redraw(select.dataset.target === "scaling"
      ? '.chart[data-kind="scale"]:not([data-axis])' : select.dataset.target === "levers"
      ? '.chart[data-kind="scale"][data-axis]' : "#" + select.dataset.target));
  }
  for (const tab of document.querySelectorAll('[role="tab"]')) {
    tab.addEventListener("click", () => {
      for (const other of document.querySelectorAll('[role="tab"]')) {
        const on = other === tab;
        other.setAttribute("aria-selected", String(on));
        document.getElementById(other.getAttribute("aria-controls")).hidden = !on;
      }
    });
  }
  for (const button of document.querySelectorAll("button.copy")) {
    button.addEventListener("click", () => {
      const pre = document.querySelector(`[data-testid="${button.dataset.copy}"]`);
      const range = document.createRange();
      range.selectNodeContents(pre);
      const sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      if (navigator.clipboard) {
        navigator.clipboard.writeText(pre.textContent).then(() => { button.textContent = "Copied"; },
                                                             () => { button.textContent = "Selected: press Ctrl+C"; });
      } else {
        button.textContent = "Selected: press Ctrl+C";
      }
    });
  }

  // The raw samples: gzip+base85 in the page, decompressed on demand (the .gz itself where the
  // browser cannot decompress).
  const csvButton = document.getElementById("csv-download");
  if (csvButton) {
    csvButton.addEventListener("click", async () => {
      const blob = new Blob([await unpack("samples-csv")], {type: "text/csv"});
      const name = csvButton.dataset.filename;
      const a = document.createElement("a");
      a.href = URL.createObjectURL(blob);
      a.download = name;
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(a.href), 60000);
    });
  }

  root.dataset.charts = charts.length ? "drawing" : "ready";
  // Let the IntersectionObserver report what is on screen before the first chart is picked.
  requestAnimationFrame(() => setTimeout(pump, 0));
})().catch((err) => {
  document.documentElement.dataset.charts = "error";
  console.error("iomatrix: the report could not be drawn:", err);
});
