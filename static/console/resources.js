// The Resources tab: one uPlot chart per metric (CPU, memory, GPU when an instance has one),
// one line per instance. The data is the JSON in #resource-data (jobs/resource_charts.py); while
// the job runs, htmx swaps #resource-live with fresh data and the charts take it with setData,
// so nothing is redrawn from scratch. A null value is a gap (the instance was not measured then:
// between attempts); uPlot.join fills the times of other instances with undefined, which it spans.
(function () {
  "use strict";
  // The page's language (djangojs.po, the catalog script in base.html); English without it.
  function gettext(s) { return window.gettext ? window.gettext(s) : s; }
  function fill(s, o) { return s.replace(/%\((\w+)\)s/g, function (m, k) { return o[k]; }); }
  const COLORS = ["#1456f0", "#c02b2b", "#1a7f37", "#b26b00", "#7b3fe4", "#0f8b8d", "#d4477b", "#5a6473"];
  const METRICS = [
    { key: "cpu", title: gettext("CPU"), unit: gettext("cores"), limit: "cpu_limit", digits: 2 },
    { key: "memory", title: gettext("Memory"), unit: "MB", limit: "memory_limit_mb", digits: 1 },
    { key: "gpu", title: "GPU", unit: "%", limit: null, digits: 1, only: "gpu" },
  ];
  let built = null; // {host, charts: {key: uPlot}, shape}
  let lastText = null; // the data the charts show: other swaps (the job socket's) change nothing here

  function readData() {
    const el = document.getElementById("resource-data");
    if (!el) return null;
    try {
      return JSON.parse(el.textContent);
    } catch (e) {
      return null;
    }
  }

  function peak(data, metric) {
    let most = 0;
    data.instances.forEach(function (inst) {
      inst[metric.key].forEach(function (v) { if (v != null && v > most) most = v; });
    });
    return most;
  }

  function limitLine(data, metric) {
    // The limit as a dashed line once the use comes near it (a quarter of it or more): an
    // 8 GB line over a job that uses 100 MB would flatten every line to the axis. The caption
    // names the limit either way.
    const limit = metric.limit ? data[metric.limit] : null;
    return limit && peak(data, metric) >= limit / 4 ? limit : null;
  }

  function aligned(data, metric) {
    const tables = data.instances.map(function (inst) {
      return [inst.t, inst[metric.key]];
    });
    const joined = tables.length ? uPlot.join(tables) : [[]];
    const limit = limitLine(data, metric);
    if (limit) joined.push(joined[0].map(function () { return limit; }));
    return joined;
  }

  function shapeOf(data) {
    // The series each chart has: the charts are rebuilt (not updated) when one appears.
    return JSON.stringify([
      data.instances.map(function (i) { return i.name; }),
      data.gpu,
      METRICS.map(function (metric) { return limitLine(data, metric); }),
    ]);
  }

  function caption(data, metric) {
    const limit = metric.limit ? data[metric.limit] : null;
    if (!limit) return fill(gettext("%(title)s (%(unit)s)"), { title: metric.title, unit: metric.unit });
    return fill(gettext("%(title)s (%(unit)s, limit %(limit)s %(unit)s)"), { title: metric.title, unit: metric.unit, limit: limit });
  }

  function options(data, metric, width) {
    const series = [{}];
    data.instances.forEach(function (inst, i) {
      series.push({
        label: inst.name,
        stroke: COLORS[i % COLORS.length],
        width: 1.5,
        points: { size: 4 },
        value: function (u, v) { return v == null ? "–" : v.toFixed(metric.digits) + " " + metric.unit; },
      });
    });
    if (limitLine(data, metric)) {
      series.push({
        label: gettext("limit"),
        stroke: "#646a73",
        dash: [6, 4],
        width: 1,
        points: { show: false },
        value: function (u, v) { return v == null ? "–" : v + " " + metric.unit; },
      });
    }
    return {
      width: width,
      height: 200,
      series: series,
      scales: { y: { range: function (u, min, max) { return [0, Math.max(max || 0, metric.key === "gpu" ? 100 : 0.001) * 1.05]; } } },
      axes: [{}, { label: metric.unit, size: 60 }],
      legend: { live: true },
    };
  }

  function build(host, data) {
    host.replaceChildren();
    const charts = {};
    const width = Math.max(320, host.clientWidth - 8);
    METRICS.forEach(function (metric) {
      if (metric.only && !data[metric.only]) return;
      const figure = document.createElement("figure");
      figure.className = "resource-chart";
      figure.dataset.metric = metric.key;
      figure.setAttribute("role", "img");
      figure.setAttribute("aria-label", fill(gettext("%(title)s per instance over time, in %(unit)s"), { title: metric.title, unit: metric.unit }));
      const title = document.createElement("figcaption");
      title.textContent = caption(data, metric);
      figure.appendChild(title);
      host.appendChild(figure);
      charts[metric.key] = new uPlot(options(data, metric, width), aligned(data, metric), figure);
    });
    return { host: host, charts: charts, shape: shapeOf(data) };
  }

  function refresh() {
    const host = document.getElementById("resource-charts");
    if (!host || typeof uPlot === "undefined") return;
    const text = (document.getElementById("resource-data") || {}).textContent;
    if (built && built.host === host && text === lastText) return;
    lastText = text;
    const data = readData();
    if (!data || !data.instances.length) {
      host.replaceChildren();
      built = null;
      return;
    }
    if (!built || built.host !== host || built.shape !== shapeOf(data)) {
      built = build(host, data);
      return;
    }
    METRICS.forEach(function (metric) {
      const chart = built.charts[metric.key];
      if (chart) chart.setData(aligned(data, metric));
    });
  }

  function resize() {
    if (!built || !document.body.contains(built.host)) return;
    const width = Math.max(320, built.host.clientWidth - 8);
    Object.values(built.charts).forEach(function (chart) {
      chart.setSize({ width: width, height: 200 });
    });
  }

  document.addEventListener("DOMContentLoaded", refresh);
  document.addEventListener("htmx:afterSettle", refresh);
  window.addEventListener("resize", resize);
})();
