"use strict";
// A queue's tasks, oldest first, a page at a time, as the filters select them. The
// filters are kept in the address, so a reload or a shared link shows the same list.
(() => {
  const { byId } = hub;
  const form = byId("filters");
  const PAGE_SIZE = 50;
  let pageNumber = 1;
  let nextCursor = null;

  // Epoch ms as a datetime-local field's value (local time).
  function toLocal(ms) {
    if (!ms) return "";
    const d = new Date(Number(ms));
    return new Date(d.getTime() - d.getTimezoneOffset() * 60_000).toISOString().slice(0, 19);
  }

  // The listing's query from the form (empty filters left out).
  function query() {
    const fields = {
      queue: form.queue.value,
      state: form.state.value,
      handler: form.handler.value.trim(),
      since_ms: hub.localMs(form.since.value),
      until_ms: hub.localMs(form.until.value),
    };
    const chosen = Object.entries(fields).filter(([, value]) => value !== "" && value !== null);
    return new URLSearchParams(chosen.map(([name, value]) => [name, String(value)]));
  }

  function showTasks(tasks) {
    hub.fillTable(
      byId("tasks"),
      tasks.map((task) => [...hub.taskCells(task), hub.time(task.finished_at_ms)]),
      "no task matches",
    );
  }

  async function load(cursor) {
    const params = query();
    params.set("limit", String(PAGE_SIZE));
    if (cursor) params.set("cursor", cursor);
    try {
      const page = await hub.getJson(`/v1/tasks?${params}`);
      hub.showError("");
      showTasks(page.tasks);
      nextCursor = page.next_cursor;
      byId("next-page").disabled = !nextCursor;
      byId("first-page").disabled = pageNumber === 1;
      byId("page-note").textContent = `page ${pageNumber}, ${page.tasks.length} tasks`;
    } catch (error) {
      hub.showError(hub.errorText(error));
    }
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    history.replaceState(null, "", `?${query()}`);
    pageNumber = 1;
    load(null);
  });
  byId("next-page").addEventListener("click", () => {
    pageNumber += 1;
    load(nextCursor);
  });
  byId("first-page").addEventListener("click", () => {
    pageNumber = 1;
    load(null);
  });

  async function start() {
    const queues = await hub.fillQueues(form.queue, hub.given("queue"));
    form.state.value = hub.given("state") || "";
    form.handler.value = hub.given("handler") || "";
    form.since.value = toLocal(hub.given("since_ms"));
    form.until.value = toLocal(hub.given("until_ms"));
    if (queues.length === 0) {
      hub.fillTable(byId("tasks"), [], "no queue yet");
      return;
    }
    load(null);
  }

  start().catch((error) => hub.showError(hub.errorText(error)));
})();
