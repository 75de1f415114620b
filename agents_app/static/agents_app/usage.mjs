// The usage page (/usage/): draws the server's figures (json_script "usage-chart-data") as two
// bar charts with the vendored Chart.js (static/vendor/chartjs, window.Chart). The tables in
// the page hold the same figures for readers without a canvas.

import { pageConfig } from "./dom.mjs";
import { usdDisplay } from "./usage_display.mjs";

const data = pageConfig("usage-chart-data");

/** CSS custom properties of the page, so the charts follow the light or dark theme. */
function themeColor(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

function barChart(canvas, labels, costs, { horizontal = false } = {}) {
  const accent = themeColor("--accent");
  const muted = themeColor("--muted");
  const border = themeColor("--border");
  const axis = { ticks: { color: muted }, grid: { color: border } };
  const money = {
    ...axis,
    beginAtZero: true,
    ticks: { color: muted, maxRotation: 0, autoSkip: true, maxTicksLimit: 5, callback: (value) => usdDisplay(String(value)) },
  };
  return new globalThis.Chart(canvas, {
    type: "bar",
    data: { labels, datasets: [{ label: "Cost (USD)", data: costs, backgroundColor: accent, borderRadius: 3, maxBarThickness: 48 }] },
    options: {
      indexAxis: horizontal ? "y" : "x",
      responsive: true,
      maintainAspectRatio: false,
      animation: false,
      plugins: {
        legend: { display: false },
        tooltip: { callbacks: { label: (item) => usdDisplay(String(item.raw)) } },
      },
      scales: horizontal ? { x: money, y: axis } : { x: { ...axis, ticks: { color: muted, maxRotation: 0, autoSkip: true } }, y: money },
    },
  });
}

function draw() {
  if (!globalThis.Chart) return; // the tables still show every figure
  const days = document.getElementById("usage-days-chart");
  if (days) {
    barChart(days, data.days.map((row) => row.day.slice(5)), data.days.map((row) => row.cost));
  }
  const agents = document.getElementById("usage-agents-chart");
  if (agents) {
    barChart(agents, data.agents.map((row) => row.agent), data.agents.map((row) => row.cost), { horizontal: true });
  }
}

// Chart.js is a deferred classic script after this module in the page: it has run by "load".
if (globalThis.Chart) draw();
else window.addEventListener("load", draw, { once: true });
