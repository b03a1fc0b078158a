"use strict";
// The overview: per queue its tasks by state, and charts of the last hour, live from
// /v1/events (one tick a second: the queues, and the last two buckets of the series,
// merged by bucket time into what GET /v1/stats gave at first).
(() => {
  const { el, byId } = hub;
  const STATES = [
    "QUEUED",
    "OFFERED",
    "RUNNING",
    "SUCCEEDED",
    "FAILED",
    "NEEDS_REVIEW",
    "CANCELLED",
  ];
  const COUNTS = ["submissions", "succeeded", "failed", "unknown"];
  const LATENCIES = ["queue_wait_p50_ms", "queue_wait_p99_ms", "attempt_p50_ms", "attempt_p99_ms"];
  const RECONNECT_MS = 2000;
  const cards = new Map(); // queue id -> {card, figures: {name: element}, paused}
  let stats = null; // {t, queues: {queue: {series: [values]}}, windowMs, stepMs}
  let queueIds = [];

  // ------------------------------------------------------------------ queues

  function makeCard(queueId) {
    const figures = {};
    const tile = (name, label, className) => {
      figures[name] = el("b", { "data-queue": queueId, "data-figure": name });
      return el("div", { className }, figures[name], label);
    };
    const paused = el("span", { className: "badge draining", text: "paused", hidden: true });
    const link = (page, text) =>
      el("a", { href: `/ui/${page}?queue=${encodeURIComponent(queueId)}`, text });
    const card = el(
      "section",
      { className: "queue", "aria-label": `queue ${queueId}` },
      el("h3", {}, el("span", { text: queueId }), " ", paused),
      el(
        "div",
        { className: "tiles" },
        ...STATES.map((state) => tile(state, state.toLowerCase().replace("_", " "), state)),
        tile("oldest_queued_age", "oldest queued", ""),
      ),
      el("p", { className: "links" }, link("tasks", "tasks"), " · ", link("review", "review")),
    );
    return { card, figures, paused };
  }

  function showQueues(queues, atMs) {
    const box = byId("queues");
    if (queues.length === 0) {
      box.replaceChildren(el("p", { className: "empty", text: "no queue yet" }));
      cards.clear();
    } else if (!cards.size) {
      box.replaceChildren();
    }
    const seen = new Set();
    queues.forEach((queue, index) => {
      seen.add(queue.queue_id);
      if (!cards.has(queue.queue_id)) {
        cards.set(queue.queue_id, makeCard(queue.queue_id));
      }
      const { card, figures, paused } = cards.get(queue.queue_id);
      // In the hub's order; a card already in its place stays (moving it would take the
      // keyboard's focus from a link in it).
      if (box.children[index] !== card) box.insertBefore(card, box.children[index] ?? null);
      for (const state of STATES) figures[state].textContent = String(queue.tasks[state] ?? 0);
      const age = queue.oldest_queued_age_ms;
      figures.oldest_queued_age.textContent = age === null ? "–" : hub.duration(age);
      paused.hidden = !queue.paused;
    });
    for (const [queueId, { card }] of cards) {
      if (!seen.has(queueId)) {
        card.remove();
        cards.delete(queueId);
      }
    }
    byId("updated").textContent = `as of ${hub.time(atMs)}`;
    queueIds = queues.map((queue) => queue.queue_id);
    showChartQueues();
  }

  // ------------------------------------------------------------------ charts

  const chartQueue = byId("chart-queue");
  const charts = {};

  function makeCharts() {
    const { LiveChart } = window.blockxCharts;
    const hour = 3600;
    // The palette runs blue, green, red: the finishes are ordered to be read by it.
    charts.submissions = new LiveChart(byId("chart-submissions"), {
      title: "Submissions (per 10 s)",
      series: ["submitted"],
      windowS: hour,
    });
    charts.finishes = new LiveChart(byId("chart-finishes"), {
      title: "Attempts ended (per 10 s)",
      series: ["unknown", "succeeded", "failed"],
      windowS: hour,
    });
    charts.queueWait = new LiveChart(byId("chart-queue-wait"), {
      title: "Queue wait (ms)",
      series: ["p50", "p99"],
      windowS: hour,
    });
    charts.attempt = new LiveChart(byId("chart-attempt"), {
      title: "Attempt duration (ms)",
      series: ["p50", "p99"],
      windowS: hour,
    });
  }

  function showChartQueues() {
    const current = chartQueue.value || hub.given("queue");
    const shown = Array.from(chartQueue.options, (option) => option.value);
    if (shown.join("\n") === queueIds.join("\n")) return;
    chartQueue.replaceChildren(
      ...queueIds.map((id) => el("option", { value: id, text: id, selected: id === current })),
    );
    draw();
  }

  // What a bucket without a sample holds: no count, or no latency.
  const none = (key) => (COUNTS.includes(key) ? 0 : null);

  function seriesOf(queueId) {
    if (!stats.queues[queueId]) {
      stats.queues[queueId] = {};
      for (const key of [...COUNTS, ...LATENCIES]) {
        stats.queues[queueId][key] = new Array(stats.t.length).fill(none(key));
      }
    }
    return stats.queues[queueId];
  }

  // The last buckets of a tick: each replaces the bucket of its time, or is added after
  // the last; buckets older than the window go.
  function merge(update, atMs) {
    update.t.forEach((bucketMs, index) => {
      let at = stats.t.lastIndexOf(bucketMs);
      if (at < 0) {
        if (stats.t.length && bucketMs < stats.t[stats.t.length - 1]) return;
        stats.t.push(bucketMs);
        for (const series of Object.values(stats.queues)) {
          for (const [key, values] of Object.entries(series)) values.push(none(key));
        }
        at = stats.t.length - 1;
      }
      for (const [queueId, columns] of Object.entries(update.queues)) {
        const series = seriesOf(queueId);
        for (const [key, values] of Object.entries(columns)) {
          if (series[key]) series[key][at] = values[index];
        }
      }
    });
    const oldest = atMs - stats.windowMs;
    while (stats.t.length && stats.t[0] < oldest) {
      stats.t.shift();
      for (const series of Object.values(stats.queues)) {
        for (const values of Object.values(series)) values.shift();
      }
    }
  }

  function draw() {
    if (!stats || !chartQueue.value) return;
    const series = seriesOf(chartQueue.value);
    charts.submissions.replace(stats.t, [series.submissions]);
    charts.finishes.replace(stats.t, [series.unknown, series.succeeded, series.failed]);
    charts.queueWait.replace(stats.t, [series.queue_wait_p50_ms, series.queue_wait_p99_ms]);
    charts.attempt.replace(stats.t, [series.attempt_p50_ms, series.attempt_p99_ms]);
    // The whole hour, however little of it this hub has counted yet.
    const end = (stats.t[stats.t.length - 1] ?? Date.now()) + stats.stepMs;
    const hour = { min: (end - stats.windowMs) / 1000, max: end / 1000 };
    for (const chart of Object.values(charts)) chart.plot.setScale("x", hour);
  }

  chartQueue.addEventListener("change", () => {
    hub.keep("queue", chartQueue.value);
    draw();
  });

  // ------------------------------------------------------------------ live

  async function loadStats() {
    const answer = await hub.getJson("/v1/stats");
    stats = { t: answer.t, queues: answer.queues, windowMs: answer.window_ms, stepMs: answer.step_ms };
    draw();
  }

  function onTick(message) {
    const tick = JSON.parse(message.data);
    hub.setLive(true);
    hub.showError("");
    showQueues(tick.queues, tick.at_ms);
    if (stats) {
      merge(tick.stats, tick.at_ms);
      draw();
    }
  }

  // The event stream, opened again (with the series read afresh) whenever it fails:
  // EventSource retries by itself only while the hub answers with a stream.
  function connect() {
    const source = new EventSource("/v1/events");
    source.addEventListener("open", () => {
      hub.setLive(true);
      loadStats().catch((error) => hub.showError(hub.errorText(error)));
    });
    source.addEventListener("tick", onTick);
    source.addEventListener("error", () => {
      hub.setLive(false, "disconnected, retrying");
      if (source.readyState === EventSource.CLOSED) {
        // Refused (signed out: a 401 sends the browser to sign in; or too many streams).
        hub.getJson("/v1/queues").catch((error) => hub.showError(hub.errorText(error)));
        setTimeout(connect, RECONNECT_MS);
      }
    });
  }

  makeCharts();
  hub
    .getJson("/v1/queues")
    .then(({ queues }) => showQueues(queues, Date.now()))
    .catch((error) => hub.showError(hub.errorText(error)));
  connect();
})();
