"use strict";
// The worker sessions open on this hub process, read again every 2 s.
(() => {
  const { el, byId } = hub;
  const REFRESH_MS = 2000;

  const capabilities = (worker) =>
    el(
      "ul",
      { className: "plain" },
      ...worker.capabilities.map((c) =>
        el("li", { text: `${c.handler} ${c.handler_version}, payload ${c.payload_version}` }),
      ),
    );

  const attempts = (worker) =>
    worker.attempts.length
      ? el(
          "ul",
          { className: "plain" },
          ...worker.attempts.map((attempt) =>
            el(
              "li",
              {},
              attempt.task_id === null ? attempt.attempt_id : hub.taskLink(attempt.task_id),
              " ",
              el("span", { className: attempt.status, text: attempt.status }),
            ),
          ),
        )
      : el("span", { className: "muted", text: "none" });

  function name(worker) {
    const cell = el("span", { text: worker.instance_id });
    if (worker.draining) cell.append(" ", el("span", { className: "badge draining", text: "draining" }));
    return cell;
  }

  async function refresh() {
    let answer;
    try {
      answer = await hub.getJson("/v1/workers");
    } catch (error) {
      hub.setLive(false, "disconnected, retrying");
      throw error;
    }
    hub.setLive(true);
    hub.showError("");
    const ago = (ms) => `${hub.duration(Math.max(answer.at_ms - ms, 0))} ago`;
    byId("hub-note").textContent =
      `The sessions open on hub ${answer.hub_id} at ${hub.time(answer.at_ms)} ` +
      "(other hubs on the same database have their own).";
    hub.fillTable(
      byId("workers"),
      answer.workers.map((worker) => [
        name(worker),
        worker.queue_id,
        worker.credential_id,
        capabilities(worker),
        [`${worker.held} / ${worker.capacity}`, "num"],
        ago(worker.opened_at_ms),
        ago(worker.last_heard_ms),
        attempts(worker),
      ]),
      "no worker session is open on this hub",
    );
  }

  hub.every(REFRESH_MS, refresh);
})();
