"use strict";
// One task: its state, its attempts on a time line, its history, payload and result.
// Read again every second until the task has ended (no change comes without an
// operator then).
(() => {
  const { el, byId } = hub;
  const ENDED = ["SUCCEEDED", "FAILED", "NEEDS_REVIEW", "CANCELLED"];
  const POLL_MS = 1000;
  const taskId = hub.given("id") || "";

  // ------------------------------------------------------------------ summary

  function showSummary(task) {
    byId("task-id").textContent = task.task_id;
    const state = byId("task-state");
    state.textContent = task.state;
    state.className = `badge ${task.state}`;
    const review = byId("review-link");
    review.hidden = task.state !== "NEEDS_REVIEW";
    review.href = `/ui/review?queue=${encodeURIComponent(task.queue_id)}`;
    const queueLink = el("a", {
      href: `/ui/tasks?queue=${encodeURIComponent(task.queue_id)}`,
      text: task.queue_id,
    });
    const facts = [
      ["queue", queueLink],
      ["handler", `${task.handler} ${task.handler_version}, payload ${task.payload_version}`],
      ["idempotency", task.idempotency],
      ["attempts started", `${task.started_attempts} of at most ${task.max_attempts}`],
      ["attempt timeout", hub.duration(task.attempt_timeout_ms)],
      ["priority", task.priority],
      ["concurrency key", task.concurrency_key ?? "none"],
      ["created", hub.time(task.created_at_ms)],
      ["deadline", hub.time(task.deadline_at_ms)],
      ["finished", task.finished_at_ms ? hub.time(task.finished_at_ms) : "not yet"],
      ["outcome uncertain", task.uncertain ? "yes: an attempt may have had its effect" : "no"],
    ];
    byId("summary").replaceChildren(
      ...facts.flatMap(([term, value]) => [
        el("dt", { text: term }),
        el("dd", {}, value instanceof Node ? value : String(value)),
      ]),
    );
  }

  // ------------------------------------------------------------------ time line

  const isLive = (attempt) => attempt.state === "OFFERED" || attempt.state === "RUNNING";
  const outcomeCode = (attempt) => attempt.outcome?.code ?? "";

  // The time line runs from the task's creation to its end (or now), far enough to
  // show every attempt, the lease deadline of one under way, and every evidence entry.
  function endOf(task, nowMs) {
    const times = [task.created_at_ms, task.finished_at_ms ?? 0];
    for (const attempt of task.attempts) {
      times.push(attempt.offered_at_ms, attempt.started_at_ms ?? 0, attempt.finished_at_ms ?? 0);
      if (isLive(attempt)) times.push(attempt.lease_deadline_ms ?? 0);
    }
    for (const entry of task.evidence) times.push(entry.at_ms);
    if (!ENDED.includes(task.state)) times.push(nowMs);
    return Math.max(...times);
  }

  function showTimeline(task, nowMs) {
    const start = task.created_at_ms;
    const end = endOf(task, nowMs);
    const span = Math.max(end - start, 1);
    const at = (ms) => `${((Math.min(ms, end) - start) / span) * 100}%`;
    const piece = (className, fromMs, toMs, title) => {
      const shape = el("span", { className, title });
      shape.style.left = at(fromMs);
      if (toMs !== null) shape.style.width = `max(2px, ${((toMs - fromMs) / span) * 100}%)`;
      return shape;
    };
    const rows = task.attempts.map((attempt) => {
      const until = attempt.finished_at_ms ?? (isLive(attempt) ? nowMs : attempt.offered_at_ms);
      const track = el("div", { className: "track" });
      const granted = attempt.started_at_ms;
      track.append(
        piece("bar offer", attempt.offered_at_ms, granted ?? until, `offered ${hub.clock(attempt.offered_at_ms)}`),
      );
      if (granted) {
        const finished = attempt.finished_at_ms ? `, finished ${hub.clock(attempt.finished_at_ms)}` : "";
        track.append(piece(`bar run ${attempt.state}`, granted, until, `granted ${hub.clock(granted)}${finished}`));
      }
      if (attempt.renewed_at_ms) {
        const title = `lease renewed ${attempt.renewals} times, the last at ${hub.clock(attempt.renewed_at_ms)}`;
        track.append(piece("renewal", attempt.renewed_at_ms, null, title));
      }
      if (attempt.lease_deadline_ms && attempt.lease_deadline_ms <= end) {
        const title = `lease deadline ${hub.clock(attempt.lease_deadline_ms)}`;
        track.append(piece("deadline", attempt.lease_deadline_ms, null, title));
      }
      for (const entry of task.evidence.filter((e) => e.attempt_id === attempt.attempt_id)) {
        track.append(piece("evidence", entry.at_ms, null, `evidence ${hub.clock(entry.at_ms)}: ${detailText(entry.detail)}`));
      }
      const label = el(
        "div",
        { className: "label" },
        `#${attempt.epoch} `,
        el("span", { className: attempt.state, text: `${attempt.state} ${outcomeCode(attempt)}`.trimEnd() }),
      );
      return el("div", { className: "row" }, label, track);
    });
    const axis = el(
      "div",
      { className: "row axis" },
      el("div", { className: "label" }),
      el(
        "div",
        { className: "track" },
        el("span", { text: `created ${hub.clock(start)}` }),
        el("span", { text: `+${hub.duration(span)}` }),
      ),
    );
    const none = el("p", { className: "empty", text: "no attempt yet" });
    byId("timeline").replaceChildren(...(rows.length ? rows : [none]), axis);
  }

  function showAttempts(task) {
    hub.fillTable(
      byId("attempts"),
      task.attempts.map((attempt) => [
        [attempt.epoch, "num"],
        [attempt.state, attempt.state],
        outcomeCode(attempt),
        hub.clock(attempt.offered_at_ms),
        hub.clock(attempt.started_at_ms),
        [attempt.renewals, "num"],
        hub.clock(attempt.renewed_at_ms),
        hub.clock(attempt.lease_deadline_ms),
        hub.clock(attempt.finished_at_ms),
        [
          attempt.finished_at_ms && attempt.started_at_ms
            ? hub.duration(attempt.finished_at_ms - attempt.started_at_ms)
            : "",
          "num",
        ],
        attempt.instance_id,
        attempt.attempt_id,
      ]),
      "no attempt yet",
    );
  }

  // ------------------------------------------------------------------ documents

  const detailText = (detail) =>
    detail === null ? "" : typeof detail === "string" ? detail : JSON.stringify(detail);

  function showDocuments(task) {
    byId("payload").textContent = hub.json(task.payload);
    const [title, shown] =
      task.result !== null
        ? ["Result", hub.json(task.result)]
        : task.failure
          ? ["Failure", hub.json(task.failure)]
          : ["Result", "none yet"];
    byId("result-title").textContent = title;
    byId("result").textContent = shown;
    hub.fillTable(
      byId("history"),
      task.history.map((entry) => [
        `${hub.time(entry.at_ms)}.${String(entry.at_ms % 1000).padStart(3, "0")}`,
        [entry.kind, entry.kind],
        entry.attempt_id ?? "",
        detailText(entry.detail),
      ]),
      "no history",
    );
  }

  // ------------------------------------------------------------------ following

  async function follow() {
    let task;
    try {
      task = await hub.getJson(`/v1/tasks/${encodeURIComponent(taskId)}`);
    } catch (error) {
      if (error instanceof hub.RequestFailed && error.status === 404) {
        hub.setLive(null, "not found");
        hub.showError(`no task ${JSON.stringify(taskId)} (it may be past its retention)`);
        return false;
      }
      hub.setLive(false, "disconnected, retrying");
      throw error;
    }
    hub.showError("");
    const nowMs = Date.now();
    showSummary(task);
    showTimeline(task, nowMs);
    showAttempts(task);
    showDocuments(task);
    const ended = ENDED.includes(task.state);
    hub.setLive(ended ? null : true, ended ? "ended" : "live");
    return !ended;
  }

  document.title = `Task ${taskId} · blockx hub`;
  hub.every(POLL_MS, follow);
})();
