"use strict";
// What every page of the hub's dashboard shares: requests to the admin API with the
// session's cookie (and, for a POST, its CSRF token), the sign-out form, the
// navigation's current page, the live badge, formatting, and building DOM from values.
// Every value from the hub is set as text (task ids, payloads and results come from
// users), never as HTML.
window.hub = (() => {
  const byId = (id) => document.getElementById(id);
  const csrfToken = () => document.querySelector('meta[name="csrf-token"]').content;

  // A request the hub did not answer with 200: its status, and its error as the message.
  class RequestFailed extends Error {
    constructor(status, body) {
      super((body && body.error) || `the hub answered ${status}`);
      this.status = status;
    }
  }

  // One request to the hub; its status and JSON body. A 401 means the session is
  // over (or was never made): the browser goes to the sign-in page.
  async function request(method, url, body) {
    const options = { method, credentials: "same-origin", headers: {} };
    if (method !== "GET") options.headers["X-CSRF-Token"] = csrfToken();
    if (body !== undefined) {
      options.headers["Content-Type"] = "application/json";
      options.body = typeof body === "string" ? body : JSON.stringify(body);
    }
    const response = await fetch(url, options);
    if (response.status === 401) {
      location.assign("/ui/sign-in");
      throw new RequestFailed(401, { error: "signed out" });
    }
    const text = await response.text();
    let parsed = null;
    try {
      parsed = text ? JSON.parse(text) : null;
    } catch {
      parsed = { error: text };
    }
    return { status: response.status, body: parsed };
  }

  // A GET's JSON body; a status other than 200 throws `RequestFailed`.
  async function getJson(url) {
    const { status, body } = await request("GET", url);
    if (status !== 200) throw new RequestFailed(status, body);
    return body;
  }

  // A POST of `body` (a value, or a JSON text sent as it is); its status and body.
  const post = (url, body) => request("POST", url, body);

  // A fresh id for an operator's action (the hub keeps its answer under it). Not
  // `crypto.randomUUID`: that exists only in a secure context (HTTPS or loopback).
  function requestId() {
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    return Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
  }

  // ------------------------------------------------------------- formatting

  const pad = (number, width = 2) => String(number).padStart(width, "0");

  // Epoch milliseconds as local date and time, to the second.
  function time(ms) {
    if (ms === null || ms === undefined) return "";
    const d = new Date(ms);
    return (
      `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`
    );
  }

  // Local time of day, to the millisecond (for events close together).
  function clock(ms) {
    if (ms === null || ms === undefined) return "";
    const d = new Date(ms);
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
  }

  // A length of time in milliseconds, in the unit that reads best.
  function duration(ms) {
    if (ms === null || ms === undefined) return "";
    if (ms < 1000) return `${Math.round(ms)} ms`;
    if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
    const units = [
      ["d", 86_400_000],
      ["h", 3_600_000],
      ["min", 60_000],
      ["s", 1000],
    ];
    const parts = [];
    let rest = Math.round(ms);
    for (const [name, size] of units) {
      if (rest >= size && parts.length < 2) {
        parts.push(`${Math.floor(rest / size)} ${name}`);
        rest %= size;
      } else if (parts.length) {
        break;
      }
    }
    return parts.join(" ");
  }

  const json = (value) => JSON.stringify(value, null, 2);

  // A datetime-local field's value (local time) as epoch ms; null when empty.
  const localMs = (value) => (value ? new Date(value).getTime() : null);

  // ------------------------------------------------------------- the address

  // A parameter of the page's address (null if absent).
  const given = (name) => new URLSearchParams(location.search).get(name);

  // Keep `name=value` in the page's address (so a reload shows the same), no new entry.
  function keep(name, value) {
    const url = new URL(location.href);
    url.searchParams.set(name, value);
    history.replaceState(null, "", url);
  }

  // --------------------------------------------------------------- building DOM

  // An element with text (or children) and attributes; `text` is set as text only.
  function el(tag, attributes = {}, ...children) {
    const element = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes)) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "text") element.textContent = String(value);
      else if (name === "className") element.className = value;
      else element.setAttribute(name, value === true ? "" : String(value));
    }
    element.append(...children.filter((child) => child !== null && child !== undefined));
    return element;
  }

  // A link to a task's page, showing its id.
  const taskLink = (taskId) =>
    el("a", { href: `/ui/task?id=${encodeURIComponent(taskId)}`, text: taskId });

  // What a list of tasks shows of each: its id (a link), state, handler, creation,
  // attempts and failure code.
  const taskCells = (task) => [
    taskLink(task.task_id),
    [task.state, task.state],
    `${task.handler} ${task.handler_version}`,
    time(task.created_at_ms),
    [`${task.started_attempts} / ${task.max_attempts}`, "num"],
    task.failure ? task.failure.code : "",
  ];

  // Replace `tbody`'s rows by `rows` (each a list of cells: a string, a number, a node,
  // or [content, className]); one row saying `emptyText` when there are none.
  function fillTable(tbody, rows, emptyText) {
    const columns = tbody.parentElement.tHead.rows[0].cells.length;
    if (rows.length === 0) {
      const cell = el("td", { className: "empty", colspan: columns, text: emptyText });
      tbody.replaceChildren(el("tr", {}, cell));
      return;
    }
    tbody.replaceChildren(
      ...rows.map((cells) =>
        el(
          "tr",
          {},
          ...cells.map((cell) => {
            const [content, className] = Array.isArray(cell) ? cell : [cell, null];
            const td = el("td", { className });
            if (content instanceof Node) td.append(content);
            else td.textContent = content === null || content === undefined ? "" : String(content);
            return td;
          }),
        ),
      ),
    );
  }

  // ------------------------------------------------------------ page furniture

  // The live badge: "live" (data is coming), what is wrong (`live` false), or why
  // nothing more is to come (`live` null).
  function setLive(live, text) {
    const badge = byId("live");
    badge.hidden = false;
    badge.textContent = text || (live ? "live" : "disconnected");
    badge.className = "badge " + (live === null ? "muted" : live ? "live" : "down");
  }

  // The error line of the page (role="alert"); "" hides it.
  function showError(text) {
    const line = byId("error");
    line.textContent = text;
    line.hidden = !text;
  }

  const errorText = (error) => (error instanceof Error ? error.message : String(error));

  // Run `work` every `periodMs` (the next run is planned once one ends, so runs never
  // overlap) until it returns false.
  function every(periodMs, work) {
    const run = async () => {
      let again = true;
      try {
        again = (await work()) !== false;
      } catch (error) {
        showError(errorText(error));
      }
      if (again) setTimeout(run, periodMs);
    };
    run();
  }

  // Options of a queue `<select>` from GET /v1/queues; `chosen` stays chosen if it is one.
  async function fillQueues(select, chosen, label = (queue) => queue.queue_id) {
    const { queues } = await getJson("/v1/queues");
    select.replaceChildren(
      ...queues.map((queue) =>
        el("option", { value: queue.queue_id, text: label(queue), selected: queue.queue_id === chosen }),
      ),
    );
    return queues;
  }

  function markCurrentPage() {
    for (const link of document.querySelectorAll("nav a")) {
      if (new URL(link.href).pathname === location.pathname) link.setAttribute("aria-current", "page");
    }
  }

  function handleSignOut() {
    byId("sign-out").addEventListener("submit", async (event) => {
      event.preventDefault();
      try {
        await post("/ui/sign-out");
      } finally {
        location.assign("/ui/sign-in");
      }
    });
  }

  markCurrentPage();
  handleSignOut();

  return {
    RequestFailed,
    byId,
    given,
    keep,
    getJson,
    post,
    requestId,
    time,
    clock,
    duration,
    json,
    localMs,
    el,
    taskLink,
    taskCells,
    fillTable,
    setLive,
    showError,
    errorText,
    every,
    fillQueues,
  };
})();
