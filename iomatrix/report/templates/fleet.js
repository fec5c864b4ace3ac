// iomatrix fleet page: each node's change against the reference (bars with 95 % CI, the noise
// floor as a band) and a node × workload map. <html data-charts> is "drawing", then "ready".
(async () => {
  "use strict";
  const root = document.documentElement;
  root.dataset.charts = "drawing";
  const D = JSON.parse(await withPlotly("fleet-data"));
  const others = D.nodes.filter((n) => n.run !== D.reference);
  const name = (n) => `${n.node} · ${n.storage} (run ${n.run})`;
  const pct = (v) => (v === null || v === undefined ? null : v * 100);
  const font = {family: getComputedStyle(document.body).fontFamily, size: 12};
  const config = {displaylogo: false, responsive: true};
  const SLOW = "#b2182b", FAST = "#2166ac";
  const colors = {slower: SLOW, faster: FAST};
  const floors = others.map((n) => n.noise_floor).filter((f) => f !== null && f !== undefined);
  const floor = floors.length ? Math.max(...floors) : null;
  const bars = {
    type: "bar", orientation: "h", y: others.map(name), x: others.map((n) => pct(n.change)),
    marker: {color: others.map((n) => colors[n.standing] ?? "#8c959f")},
    error_x: {type: "data", symmetric: false, visible: true,
              array: others.map((n) => (n.high == null || n.change == null ? null : (n.high - n.change) * 100)),
              arrayminus: others.map((n) => (n.low == null || n.change == null ? null : (n.change - n.low) * 100))},
    hovertext: others.map((n) => `<b>${name(n)}</b><br>${n.verdict}`), hovertemplate: "%{hovertext}<extra></extra>",
  };
  const shapes = floor === null ? [] : [{type: "rect", yref: "paper", y0: 0, y1: 1, x0: -floor * 100, x1: floor * 100,
                                         fillcolor: "#8c959f", opacity: 0.15, line: {width: 0}, layer: "below"}];
  const nodesEl = document.querySelector('.chart[data-kind="nodes"]');
  await Plotly.react(nodesEl, [bars], {
    title: {text: `${D.metric_name}: each node against run ${D.reference}`, font: {size: 14}},
    height: 120 + 28 * others.length, margin: {l: 260, r: 20, t: 44, b: 50}, font,
    xaxis: {title: {text: "% change" + (D.higher_is_better ? " (negative = slower)" : " (positive = slower)")},
            ticksuffix: " %", zeroline: true}, yaxis: {autorange: "reversed", automargin: true}, shapes,
  }, config);
  nodesEl.dataset.drawn = "1";
  const matrixEl = document.querySelector('.chart[data-kind="matrix"]');
  const z = others.map((n) => (D.matrix[String(n.run)] ?? []).map(pct));
  await Plotly.react(matrixEl, [{
    type: "heatmap", x: D.workloads, y: others.map(name), z, zmid: 0,
    // red where the node is slower: low values for a rate, high ones for a latency
    colorscale: [[0, SLOW], [0.5, "#f7f7f7"], [1, FAST]], reversescale: !D.higher_is_better,
    colorbar: {ticksuffix: " %"},
    hovertemplate: "%{y}<br>%{x}: %{z:+.1f} %<extra></extra>",
  }], {height: 160 + 28 * others.length, margin: {l: 260, r: 20, t: 20, b: 120}, font,
       xaxis: {tickangle: -45, automargin: true}, yaxis: {autorange: "reversed", automargin: true}}, config);
  matrixEl.dataset.drawn = "1";
  root.dataset.charts = "ready";
})().catch((err) => {
  document.documentElement.dataset.charts = "error";
  console.error("iomatrix: the fleet page could not be drawn:", err);
});
