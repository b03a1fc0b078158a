"use strict";
// Review and redrive: a queue's tasks that need review (or have failed, or wait), each
// with retry / resolve / cancel where the hub's rules allow it, and the bulk retry and
// cancel, counted (a dry run) before they are done. Every action sends a fresh
// request id: the hub keeps its answer under it.
(() => {
  const { el, byId } = hub;
  const choose = byId("choose");
  const LIMIT = 100;
  // The states each action applies to (the hub declines it in any other).
  const ACTS_ON = { retry: ["NEEDS_REVIEW", "FAILED"], resolve: ["NEEDS_REVIEW"], cancel: ["QUEUED"] };

  const queue = () => choose.queue.value;
  const note = (text) => {
    byId("action-note").textContent = text;
  };

  // ------------------------------------------------------------------ the list

  function actions(task) {
    const buttons = Object.keys(ACTS_ON).map((action) =>
      el("button", {
        type: "button",
        "data-action": action,
        "aria-label": `${action} task ${task.task_id}`,
        disabled: !ACTS_ON[action].includes(task.state),
        text: action[0].toUpperCase() + action.slice(1),
      }),
    );
    return el("span", { className: "actions" }, ...buttons);
  }

  async function showTasks() {
    if (!queue()) {
      hub.fillTable(byId("review-tasks"), [], "no queue yet");
      return;
    }
    const params = new URLSearchParams({ queue: queue(), state: choose.state.value, limit: LIMIT });
    const page = await hub.getJson(`/v1/tasks?${params}`);
    const tbody = byId("review-tasks");
    hub.fillTable(
      tbody,
      page.tasks.map((task) => [...hub.taskCells(task), actions(task)]),
      `no ${choose.state.value} task in ${queue()}`,
    );
    page.tasks.forEach((task, index) => {
      tbody.rows[index].dataset.taskId = task.task_id;
    });
    byId("more-note").textContent = page.next_cursor
      ? `the oldest ${LIMIT} are shown: act on them, or use the tasks page`
      : "";
  }

  async function refresh() {
    const label = (q) => `${q.queue_id} (${q.tasks.NEEDS_REVIEW} need review)`;
    await hub.fillQueues(choose.queue, queue() || hub.given("queue"), label);
    await showTasks();
  }

  const reload = () => refresh().catch((error) => hub.showError(hub.errorText(error)));

  // ------------------------------------------------------------------ one task

  // Send `body` (a value, or a JSON text) to act on one task, say what came of it and
  // read the list again; whether it was done, and what was said.
  async function act(taskId, action, body) {
    const url = `/v1/tasks/${encodeURIComponent(taskId)}:${action}`;
    const { status, body: answer } = await hub.post(url, body);
    const done = status === 200;
    const said = done
      ? `task ${taskId}: ${action} done, it is ${answer.state} now`
      : `task ${taskId}: ${action} refused (${status}): ${answer && answer.error}`;
    note(said);
    reload();
    return { done, said };
  }

  byId("review-tasks").addEventListener("click", (event) => {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const taskId = button.closest("tr").dataset.taskId;
    const action = button.dataset.action;
    if (action === "resolve") {
      openResolve(taskId);
    } else {
      button.disabled = true;
      act(taskId, action, { request_id: hub.requestId() }).catch((error) =>
        note(hub.errorText(error)),
      );
    }
  });

  // ------------------------------------------------------------------ resolving

  const dialog = byId("resolve-dialog");
  const resolveForm = byId("resolve-form");
  let resolving = "";

  function openResolve(taskId) {
    resolving = taskId;
    byId("resolve-task").textContent = taskId;
    byId("resolve-error").textContent = "";
    resolveForm.reset();
    showOutcomeFields();
    dialog.showModal();
  }

  function showOutcomeFields() {
    const failed = resolveForm.outcome.value === "FAILED";
    for (const field of resolveForm.querySelectorAll(".when-failed")) field.hidden = !failed;
    for (const field of resolveForm.querySelectorAll(".when-succeeded")) field.hidden = failed;
    byId("resolve-code").required = failed;
    byId("resolve-result").required = !failed;
  }

  // A JSON text as typed, once it is known to be one JSON value (sent as it is, so that
  // numbers keep every digit); throws naming `what` otherwise.
  function jsonText(text, what) {
    try {
      JSON.parse(text);
    } catch {
      throw new Error(`the ${what} is not JSON: ${text.slice(0, 80)}`);
    }
    return text.trim();
  }

  // The resolve request's body, as a JSON text.
  function resolveBody() {
    const fields = [`"request_id":${JSON.stringify(hub.requestId())}`];
    if (resolveForm.outcome.value === "SUCCEEDED") {
      fields.push(`"outcome":"SUCCEEDED"`, `"result":${jsonText(resolveForm.result.value, "result")}`);
    } else {
      fields.push(`"outcome":"FAILED"`, `"code":${JSON.stringify(resolveForm.code.value)}`);
      const details = resolveForm.details.value.trim();
      if (details) fields.push(`"details":${jsonText(details, "details")}`);
    }
    return `{${fields.join(",")}}`;
  }

  resolveForm.addEventListener("change", showOutcomeFields);
  byId("resolve-close").addEventListener("click", () => dialog.close());
  resolveForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const { done, said } = await act(resolving, "resolve", resolveBody());
      if (done) dialog.close();
      else byId("resolve-error").textContent = said;
    } catch (error) {
      byId("resolve-error").textContent = error.message;
    }
  });

  // ------------------------------------------------------------------ bulk

  function bulk(form) {
    const action = form.dataset.action;
    const count = form.querySelector(".count");
    const confirm = form.querySelector(".confirm");

    function body(dryRun) {
      const fields = { request_id: hub.requestId(), dry_run: dryRun };
      if (form.state && form.state.value) fields.state = form.state.value;
      if (form.handler.value.trim()) fields.handler = form.handler.value.trim();
      if (form.since.value) fields.since_ms = hub.localMs(form.since.value);
      if (form.until.value) fields.until_ms = hub.localMs(form.until.value);
      return fields;
    }

    async function send(dryRun) {
      const url = `/v1/queues/${encodeURIComponent(queue())}/tasks:${action}`;
      const { status, body: answer } = await hub.post(url, body(dryRun));
      if (status !== 200) throw new Error(`${action} refused (${status}): ${answer && answer.error}`);
      return answer;
    }

    function forget() {
      count.textContent = "";
      confirm.hidden = true;
    }

    form.addEventListener("input", forget);
    choose.addEventListener("change", forget);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      forget();
      try {
        const { count: matching } = await send(true);
        count.textContent = `${matching} ${matching === 1 ? "task matches" : "tasks match"} in ${queue()}`;
        confirm.textContent = `${action === "retry" ? "Retry" : "Cancel"} ${matching === 1 ? "it" : `these ${matching}`}`;
        confirm.hidden = matching === 0;
      } catch (error) {
        count.textContent = error.message;
      }
    });
    confirm.addEventListener("click", async () => {
      confirm.hidden = true;
      try {
        const done = await send(false);
        const more = done.more ? " (more match: count again to go on)" : "";
        count.textContent = `${done.count} ${action === "retry" ? "retried" : "cancelled"}${more}`;
      } catch (error) {
        count.textContent = error.message;
      }
      await reload();
    });
  }

  document.querySelectorAll("form.bulk").forEach(bulk);
  choose.addEventListener("submit", (event) => event.preventDefault());
  choose.addEventListener("change", () => {
    hub.keep("queue", queue());
    note("");
    reload();
  });
  reload();
})();
