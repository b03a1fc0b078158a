"use strict";
// Live line charts over a rolling time window, drawn by uPlot (vendored, see
// /assets/vendor/uplot/README.md). One chart per element; `push` adds one point
// per series, `replace` sets the whole window (as sent by the server).
// Each chart's element carries `data-points`: how many points it shows now.
window.blockxCharts = (() => {
  const palette = ["#39f", "#2a7", "#d44", "#d90", "#a5d", "#888"];
  const height = 170;
  const widthOf = (element) => Math.max(element.clientWidth, 220);
  // Time ticks of whole seconds and up (in seconds): points come a second or more apart.
  const timeSteps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400];

  // The y axis as wide as its longest label, so "1500 ms" is not cut.
  function axisSize(plot, values, axisIndex, cycle) {
    const axis = plot.axes[axisIndex];
    if (cycle > 1) return axis._size;
    const longest = (values || []).reduce((a, b) => (b.length > a.length ? b : a), "");
    plot.ctx.font = axis.font[0];
    const text = longest ? plot.ctx.measureText(longest).width / devicePixelRatio : 0;
    return Math.ceil(axis.ticks.size + axis.gap + text + 4);
  }

  function format(value, unit) {
    if (value === null || value === undefined || Number.isNaN(value)) return "–";
    const digits = Math.abs(value) >= 100 ? 0 : Math.abs(value) >= 10 ? 1 : 2;
    return value.toFixed(digits) + unit;
  }

  class LiveChart {
    // element: where to draw; title: above the plot; series: one label each (or
    // { label, stroke } to choose its colour); unit: appended to values ("/s", " ms");
    // windowS: how much time is kept.
    constructor(element, { title, series, unit = "", windowS = 300 }) {
      this.element = element;
      this.windowS = windowS;
      this.data = [[], ...series.map(() => [])];
      const options = {
        title,
        width: widthOf(element),
        height,
        cursor: { drag: { x: false, y: false } },
        scales: { x: { time: true } },
        series: [
          {},
          ...series.map((entry, index) => ({
            label: typeof entry === "string" ? entry : entry.label,
            stroke: entry.stroke || palette[index % palette.length],
            width: 1.5,
            spanGaps: false,
            value: (plot, value) => format(value, unit),
          })),
        ],
        axes: [
          { stroke: "#888", grid: { stroke: "rgba(128,128,128,.15)" }, incrs: timeSteps },
          {
            stroke: "#888",
            size: axisSize,
            grid: { stroke: "rgba(128,128,128,.15)" },
            values: (plot, ticks) => ticks.map((tick) => format(tick, unit)),
          },
        ],
      };
      this.plot = new uPlot(options, this.data, element);
      element.dataset.points = "0";
      new ResizeObserver(() => {
        this.plot.setSize({ width: widthOf(element), height });
      }).observe(element);
    }

    // One point per series at atMs (epoch milliseconds); older than the window go.
    push(atMs, values) {
      const [times, ...columns] = this.data;
      times.push(atMs / 1000);
      columns.forEach((column, index) => column.push(values[index] ?? null));
      const oldest = atMs / 1000 - this.windowS;
      while (times.length && times[0] < oldest) {
        times.shift();
        columns.forEach((column) => column.shift());
      }
      this.draw();
    }

    // The whole window at once: timesMs (epoch milliseconds) and one column per series.
    replace(timesMs, columns) {
      this.data = [timesMs.map((at) => at / 1000), ...columns];
      this.draw();
    }

    draw() {
      this.plot.setData(this.data);
      this.element.dataset.points = String(this.data[0].length);
    }
  }

  return { LiveChart, format };
})();
