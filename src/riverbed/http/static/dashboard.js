// Riverbed's dashboard (docs/dashboard.md): plain JavaScript over the admin API.
//
// Every few seconds it asks /api/v1 for what each panel shows and draws it with
// DOM calls (text goes in as textContent: client ids and topics are chosen by
// MQTT clients, never markup). A 401 shows the token form; the token is kept in
// sessionStorage (this tab only) and sent as `Authorization: Bearer`. Errors are
// shown in the panel they belong to, never thrown to the console; an endpoint
// this server does not have (404 "Not Found") makes its panel say so.
"use strict";

(() => {
  const API = "/api/v1";
  const TOKEN_KEY = "riverbed.token";
  const STATS_EVERY_MS = 2000; // the broker's numbers and the plots
  const PANELS_EVERY = 3; // the lists (clients, topics, ...) every third tick
  const WINDOW_SECONDS = 300; // the plots show the last five minutes
  const JOB_POLL_MS = 1000;
  const CONFIRM_MS = 5000; // how long "Purge" waits for its confirming click

  const $ = (id) => document.getElementById(id);

  // ------------------------------------------------------------------ the API

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
    // A route this server does not have (another version, or `riverbed admin`
    // without it): FastAPI's own 404 says just "Not Found".
    get missing() {
      return this.status === 404 && this.message === "Not Found";
    }
  }

  let waitingForToken = false;

  async function call(method, path, body) {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = `Bearer ${token}`;
    const options = { method, headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(API + path, options);
    } catch (error) {
      throw new ApiError(0, `the server cannot be reached (${error.message})`);
    }
    const text = await response.text().catch(() => "");
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = null;
    }
    if (!response.ok) {
      const message =
        data && typeof data.error === "string" ? data.error : `HTTP ${response.status}`;
      if (response.status === 401) askForToken(message);
      throw new ApiError(response.status, message);
    }
    return data;
  }

  const get = (path) => call("GET", path);

  // ------------------------------------------------------------------ token flow

  function askForToken(reason) {
    waitingForToken = true;
    const had = sessionStorage.getItem(TOKEN_KEY);
    $("token-reason").textContent = had
      ? `The token was refused: ${reason}`
      : "Requests to this server need a bearer token.";
    $("token-form").classList.remove("hidden");
    $("dashboard").classList.add("hidden");
    $("token-input").focus();
  }

  function onTokenSubmit(event) {
    event.preventDefault();
    const token = $("token-input").value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("token-input").value = "";
    $("token-form").classList.add("hidden");
    $("dashboard").classList.remove("hidden");
    waitingForToken = false;
    showTokenButton();
    refresh(true);
  }

  function forgetToken() {
    sessionStorage.removeItem(TOKEN_KEY);
    showTokenButton();
    refresh(true);
  }

  function showTokenButton() {
    $("forget-token").classList.toggle("hidden", !sessionStorage.getItem(TOKEN_KEY));
  }

  // ------------------------------------------------------------------ helpers

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (key === "class") node.className = value;
      else if (key === "on") for (const [type, fn] of Object.entries(value)) node.addEventListener(type, fn);
      else if (key === "data") Object.assign(node.dataset, value);
      else node[key] = value;
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  function fill(tbody, rows, columns, empty) {
    if (rows.length === 0) {
      tbody.replaceChildren(el("tr", {}, el("td", { class: "empty", colSpan: columns }, empty)));
    } else {
      tbody.replaceChildren(...rows);
    }
  }

  function td(value, className) {
    return el("td", className ? { class: className } : {}, value === null || value === undefined ? "–" : value);
  }

  const numberFormat = new Intl.NumberFormat("en-US");
  const count = (n) => (typeof n === "number" ? numberFormat.format(n) : "–");
  const rate = (r) => (Number.isFinite(r) ? r.toFixed(1) : "–");

  function millis(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    const ms = seconds * 1000;
    return ms < 10 ? ms.toFixed(1) : ms.toFixed(0);
  }

  // An RFC 3339 time as the API gives it, to the second and without the "T".
  function when(text) {
    return typeof text === "string" ? text.replace("T", " ").replace(/\.\d+/, "") : text;
  }

  function duration(seconds) {
    const s = Math.floor(seconds);
    const d = Math.floor(s / 86400);
    const h = Math.floor((s % 86400) / 3600);
    const m = Math.floor((s % 3600) / 60);
    if (d) return `${d}d ${h}h`;
    if (h) return `${h}h ${m}m`;
    if (m) return `${m}m ${s % 60}s`;
    return `${s}s`;
  }

  // What the last action of a panel did ("replayed 7", or why it failed): shown
  // until the next action, where a refresh would otherwise clear the status.
  const notes = {};

  function note(panel, text, isError) {
    notes[panel] = { text, isError };
    status(panel, text, isError);
  }

  function noted(panel) {
    const last = notes[panel];
    status(panel, last ? last.text : "", last ? last.isError : false);
  }

  function status(panel, text, isError) {
    const node = $(`${panel}-status`);
    node.textContent = text || "";
    node.classList.toggle("error", Boolean(isError));
  }

  // Panels whose route this server does not have: not asked again (each
  // refused request is also an error line in the browser's console).
  const unavailable = new Set();

  // What a panel says when its request failed; true if it should be emptied.
  function failed(panel, error) {
    if (error.missing) {
      unavailable.add(panel);
      status(panel, "not available on this server", false);
      return true;
    }
    if (error.status === 401) {
      status(panel, "waiting for a token", false);
      return false;
    }
    status(panel, error.message, true);
    return false;
  }

  function banner(text) {
    $("banner").textContent = text || "";
    $("banner").classList.toggle("hidden", !text);
  }

  // ------------------------------------------------------------------ plots

  // A uPlot chart over `history` ({at: [], name: []...}) of the last WINDOW_SECONDS.
  class Chart {
    constructor(container, series) {
      this.container = container;
      this.series = series;
      this.plot = null;
      if (typeof ResizeObserver === "function") {
        new ResizeObserver(() => this.resize()).observe(container);
      }
    }

    width() {
      return Math.max(this.container.clientWidth - 4, 200);
    }

    resize() {
      if (this.plot) this.plot.setSize({ width: this.width(), height: 200 });
    }

    draw(columns) {
      this.container.dataset.points = String(columns[0].length);
      if (typeof uPlot !== "function") return; // the script failed to load: numbers only
      if (this.plot === null) {
        const options = {
          width: this.width(),
          height: 200,
          series: [
            {},
            ...this.series.map((s) => ({ label: s.label, stroke: s.color, dash: s.dash, width: 2, points: { show: false } })),
          ],
          axes: [{}, { size: 60 }],
          // The whole window, whatever part of it has points yet.
          scales: {
            x: { time: true, range: (u, min, max) => (max === null ? [min, max] : [max - WINDOW_SECONDS, max]) },
          },
          legend: { live: false },
          cursor: { drag: { x: false, y: false } },
        };
        this.plot = new uPlot(options, columns, this.container);
      } else {
        this.plot.setData(columns);
      }
    }

    reset() {
      if (this.plot) this.plot.destroy();
      this.plot = null;
      this.container.dataset.points = "0";
    }
  }

  function trim(history, now) {
    const oldest = now - WINDOW_SECONDS;
    let drop = 0;
    while (drop < history.at.length && history.at[drop] < oldest) drop += 1;
    if (drop) for (const key of Object.keys(history)) history[key].splice(0, drop);
  }

  // ------------------------------------------------------------------ broker numbers

  const rates = { at: [], in: [], out: [] };
  let ratesChart = null;
  let previousStats = null;

  const subscriptionHistory = new Map(); // name -> {at, lag, rq, dlq}
  let subscriptionChart = null;
  let subscriptionsFromStats = false;

  async function refreshStats() {
    if (unavailable.has("overview")) return;
    let stats;
    try {
      stats = await get("/stats");
    } catch (error) {
      failed("overview", error);
      subscriptionsFromStats = false;
      return;
    }
    status("overview", "");
    $("node").textContent = `node ${stats.node} · up ${duration(stats.uptime_seconds)}`;
    $("stat-publish-in").textContent = count(stats.publish_in);
    $("stat-publish-out").textContent = count(stats.publish_out);
    $("stat-connections").textContent = count(stats.connections);
    $("stat-sessions").textContent = `${count(stats.sessions_online)} / ${count(stats.sessions_offline)}`;
    $("stat-in-flight").textContent = count(stats.in_flight);
    const commit = stats.commit || {};
    $("stat-commit").textContent = `${millis(commit.p50_seconds)} / ${millis(commit.p99_seconds)} ms`;

    const before = previousStats;
    previousStats = stats;
    if (before !== null && stats.at > before.at) {
      const seconds = stats.at - before.at;
      const restarted = stats.publish_in < before.publish_in || stats.node !== before.node;
      if (restarted) {
        for (const key of Object.keys(rates)) rates[key].length = 0;
      } else {
        const rateIn = (stats.publish_in - before.publish_in) / seconds;
        const rateOut = (stats.publish_out - before.publish_out) / seconds;
        rates.at.push(stats.at);
        rates.in.push(rateIn);
        rates.out.push(rateOut);
        $("stat-rate-in").textContent = rate(rateIn);
        $("stat-rate-out").textContent = rate(rateOut);
      }
      trim(rates, stats.at);
      ratesChart.draw([rates.at, rates.in, rates.out]);
    }

    // Until the broker's first storage reading, the list answers instead.
    subscriptionsFromStats = stats.readings_at > 0;
    if (!subscriptionsFromStats) return;
    showSubscriptions(
      stats.subscriptions.map((s) => ({
        name: s.name,
        lag: s.lag,
        retry_queue: s.retry_queue,
        dead_letter_queue: s.dead_letter_queue,
      })),
      stats.readings_at, // a point per storage reading (every few seconds), not per poll
    );
  }

  // ------------------------------------------------------------------ subscriptions

  let delivering = []; // names of the subscriptions with a DLQ

  async function refreshSubscriptionList() {
    let listed;
    try {
      listed = await get("/subscriptions");
    } catch (error) {
      if (!subscriptionsFromStats && failed("subscriptions", error)) fill($("subscriptions-rows"), [], 4, "");
      return;
    }
    delivering = listed.filter((s) => s.endpoint !== null && s.endpoint !== undefined).map((s) => s.name);
    fillDlqChoices();
    // Without /stats the list is where lag and queue depths come from.
    if (!subscriptionsFromStats) showSubscriptions(listed, Date.now() / 1000);
  }

  function showSubscriptions(subscriptions, at) {
    status("subscriptions", "");
    for (const s of subscriptions) {
      let history = subscriptionHistory.get(s.name);
      if (!history) {
        history = { at: [], lag: [], rq: [], dlq: [] };
        subscriptionHistory.set(s.name, history);
      }
      if (history.at.length && history.at[history.at.length - 1] >= at) continue;
      history.at.push(at);
      history.lag.push(s.lag);
      history.rq.push(s.retry_queue ?? null);
      history.dlq.push(s.dead_letter_queue ?? null);
      trim(history, at);
    }
    const current = new Set(subscriptions.map((s) => s.name));
    for (const name of subscriptionHistory.keys()) if (!current.has(name)) subscriptionHistory.delete(name);

    const select = $("subscription-plotted");
    const chosen = select.value;
    const rows = subscriptions.map((s) =>
      el(
        "tr",
        { class: `selectable${s.name === chosen ? " selected" : ""}`, on: { click: () => plotSubscription(s.name) } },
        td(s.name),
        td(count(s.lag), "num"),
        td(s.retry_queue === null || s.retry_queue === undefined ? "–" : count(s.retry_queue), "num"),
        td(s.dead_letter_queue === null || s.dead_letter_queue === undefined ? "–" : count(s.dead_letter_queue), "num"),
      ),
    );
    fill($("subscriptions-rows"), rows, 4, "no named subscriptions");
    setOptions(select, subscriptions.map((s) => s.name));
    drawSubscription();
  }

  function plotSubscription(name) {
    $("subscription-plotted").value = name;
    for (const row of $("subscriptions-rows").children) {
      row.classList.toggle("selected", row.firstChild.textContent === name);
    }
    subscriptionChart.reset();
    drawSubscription();
  }

  function drawSubscription() {
    const history = subscriptionHistory.get($("subscription-plotted").value);
    if (!history) {
      subscriptionChart.reset();
      return;
    }
    subscriptionChart.draw([history.at, history.lag, history.rq, history.dlq]);
  }

  // Keeps a <select>'s choice when its options are the same names again.
  function setOptions(select, names, none) {
    const chosen = select.value;
    const same =
      select.options.length === names.length && names.every((name, i) => select.options[i].value === name);
    if (!same) {
      select.replaceChildren(...names.map((name) => el("option", { value: name }, name)));
      if (names.length === 0 && none) select.append(el("option", { value: "" }, none));
      if (names.includes(chosen)) select.value = chosen;
    }
    return select.value;
  }

  // ------------------------------------------------------------------ clients

  let clientsQuery = "";

  async function refreshClients() {
    if (unavailable.has("clients")) return;
    const query = clientsQuery;
    let clients;
    try {
      clients = await get(query ? `/clients?q=${encodeURIComponent(query)}` : "/clients");
    } catch (error) {
      if (failed("clients", error)) fill($("clients-rows"), [], 8, "");
      return;
    }
    if (query !== clientsQuery) return; // typed on meanwhile: a newer request follows
    noted("clients");
    // Also filtered here, so the search works against a server without `q`.
    const needle = query.toLowerCase();
    const shown = clients.filter(
      (c) =>
        !needle ||
        [c.client_id, c.username, c.peer].some((v) => typeof v === "string" && v.toLowerCase().includes(needle)),
    );
    shown.sort((a, b) => a.client_id.localeCompare(b.client_id));
    $("clients-count").textContent = `${count(shown.length)} shown`;
    const rows = shown.map((c) =>
      el(
        "tr",
        { data: { clientId: c.client_id } },
        td(c.client_id),
        td(c.username),
        td(Array.isArray(c.peer) ? c.peer.join(":") : c.peer),
        td(c.protocol),
        td(c.keep_alive, "num"),
        td(c.in_flight, "num"),
        td(when(c.connected_since)),
        el("td", {}, el("button", { type: "button", class: "danger", on: { click: (e) => disconnect(c.client_id, e.target) } }, "Disconnect")),
      ),
    );
    fill($("clients-rows"), rows, 8, query ? "no client matches" : "no clients connected");
  }

  async function disconnect(clientId, button) {
    button.disabled = true;
    try {
      await call("DELETE", `/clients/${encodeURIComponent(clientId)}`);
      note("clients", `disconnected ${clientId}`);
    } catch (error) {
      button.disabled = false;
      note("clients", `${clientId}: ${error.message}`, true);
      return;
    }
    await refreshClients();
  }

  let searchTimer = null;
  function onSearch() {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => {
      clientsQuery = $("clients-search").value.trim();
      refreshClients();
    }, 250);
  }

  // ------------------------------------------------------------------ shared groups

  let chosenGroup = null; // {name, filter}

  async function refreshGroups() {
    if (unavailable.has("groups")) return;
    let groups;
    try {
      groups = await get("/groups");
    } catch (error) {
      if (failed("groups", error)) {
        fill($("groups-rows"), [], 5, "");
        $("group-detail").replaceChildren();
      }
      return;
    }
    status("groups", "");
    const isChosen = (g) => chosenGroup && g.name === chosenGroup.name && g.filter === chosenGroup.filter;
    if (chosenGroup && !groups.some(isChosen)) chosenGroup = null;
    const rows = groups.map((g) =>
      el(
        "tr",
        {
          class: `selectable${isChosen(g) ? " selected" : ""}`,
          on: { click: () => chooseGroup(g) },
        },
        td(g.name),
        td(g.filter),
        td(g.leader ? g.leader.node : "none"),
        td(count(g.members), "num"),
        // Not exact: an upper bound (messages of its topics the filter does not match count too).
        td(g.lag === null || g.lag === undefined ? "–" : `${g.lag_exact === false ? "≤ " : ""}${count(g.lag)}`, "num"),
      ),
    );
    fill($("groups-rows"), rows, 5, "no shared subscriptions");
    await refreshGroupDetail();
  }

  function chooseGroup(group) {
    chosenGroup = { name: group.name, filter: group.filter };
    refreshGroups();
  }

  async function refreshGroupDetail() {
    const detail = $("group-detail");
    if (!chosenGroup) {
      detail.replaceChildren(el("p", { class: "muted" }, "Choose a group to see its members and streams."));
      return;
    }
    let group;
    try {
      group = await get(`/groups/${encodeURIComponent(chosenGroup.name)}/${encodeURIComponent(chosenGroup.filter)}`);
    } catch (error) {
      detail.replaceChildren(el("p", { class: "muted" }, error.missing ? "not available on this server" : error.message));
      return;
    }
    // Members by their MQTT client id where the server says it.
    const names = new Map(group.members.map((m) => [m.member, m.client_id ?? m.member]));
    const members = group.members.map((m) =>
      el("tr", {}, td(names.get(m.member)), td(m.node), td((m.streams || []).join(", "), "wrap")),
    );
    const streams = group.streams.map((s) =>
      el(
        "tr",
        {},
        td(s.stream),
        td(s.holder === null || s.holder === undefined ? "unassigned" : names.get(s.holder) ?? s.holder),
        td(`${s.lag_exact === false ? "≤ " : ""}${count(s.lag)}`, "num"),
      ),
    );
    const membersBody = el("tbody");
    const streamsBody = el("tbody");
    fill(membersBody, members, 3, "no members");
    fill(streamsBody, streams, 3, "no streams");
    detail.replaceChildren(
      el("h3", {}, `$share/${group.name}/${group.filter}`),
      el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "Member"), el("th", {}, "Node"), el("th", {}, "Streams"))), membersBody),
      el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "Stream"), el("th", {}, "Held by"), el("th", { class: "num" }, "Lag"))), streamsBody),
    );
  }

  // ------------------------------------------------------------------ topics

  let chosenTopic = null;

  function generations(topic) {
    const pointer = topic.produce_pointer;
    return (topic.storage_topics || [])
      .map((s, i) => `g${s.generation}: ${s.partitions}${i === pointer ? " (produce)" : ""}`)
      .join(", ");
  }

  async function refreshTopics() {
    if (unavailable.has("topics")) return;
    let topics;
    try {
      topics = await get("/topics");
    } catch (error) {
      if (failed("topics", error)) fill($("topics-rows"), [], 4, "");
      return;
    }
    status("topics", "");
    if (chosenTopic && !topics.some((t) => t.name === chosenTopic)) chosenTopic = null;
    const rows = topics.map((t) =>
      el(
        "tr",
        {
          class: `selectable${t.name === chosenTopic ? " selected" : ""}`,
          on: { click: () => chooseTopic(t.name) },
        },
        td(t.name),
        td(t.binding ?? "–"),
        td(generations(t), "wrap"),
        td(count(t.messages), "num"),
      ),
    );
    fill($("topics-rows"), rows, 4, "no topics");
    await refreshTopicDetail();
  }

  function chooseTopic(name) {
    chosenTopic = name;
    refreshTopics();
  }

  async function refreshTopicDetail() {
    const detail = $("topic-detail");
    if (!chosenTopic) {
      detail.replaceChildren(el("p", { class: "muted" }, "Choose a topic to see its streams."));
      return;
    }
    let topic;
    try {
      topic = await get(`/topics/${encodeURIComponent(chosenTopic)}`);
    } catch (error) {
      detail.replaceChildren(el("p", { class: "muted" }, error.message));
      return;
    }
    const streams = topic.streams.map((s) =>
      el("tr", {}, td(s.stream), td(count(s.start_offset), "num"), td(count(s.next_offset), "num"), td(s.sealed ? "sealed" : "")),
    );
    const body = el("tbody");
    fill(body, streams, 4, "no streams");
    const subscriptions = topic.subscriptions && topic.subscriptions.length ? topic.subscriptions.join(", ") : "none";
    detail.replaceChildren(
      el("h3", {}, `${topic.name}: ${generations(topic)}`),
      el("p", { class: "muted" }, `retention ${topic.retention ?? "none"} (${topic.retention_policy}); subscriptions: ${subscriptions}`),
      el(
        "table",
        {},
        el("thead", {}, el("tr", {}, el("th", {}, "Stream"), el("th", { class: "num" }, "First offset"), el("th", { class: "num" }, "Next offset"), el("th", {}, ""))),
        body,
      ),
    );
  }

  // ------------------------------------------------------------------ dead-letter queue

  let dlqBusy = false; // a replay or purge in progress: buttons stay off
  let purgeArmed = null; // the timer of a first "Purge" click awaiting its confirmation
  let dlqTotal = 0;

  function fillDlqChoices() {
    const chosen = setOptions($("dlq-subscription"), delivering, "no delivering subscriptions");
    $("dlq-subscription").disabled = delivering.length === 0;
    return chosen;
  }

  function dlqButtons() {
    const name = $("dlq-subscription").value;
    const off = dlqBusy || !name || dlqTotal === 0;
    $("dlq-replay").disabled = off;
    $("dlq-purge").disabled = off;
  }

  async function refreshDlq() {
    if (unavailable.has("dlq")) return;
    const name = $("dlq-subscription").value;
    if (!name) {
      dlqTotal = 0;
      $("dlq-summary").textContent = "Dead letters are kept by subscriptions that deliver to an endpoint.";
      fill($("dlq-rows"), [], 5, "nothing to show");
      dlqButtons();
      return;
    }
    let answer;
    try {
      answer = await get(`/subscriptions/${encodeURIComponent(name)}/dlq?limit=50`);
    } catch (error) {
      dlqTotal = 0;
      if (failed("dlq", error)) fill($("dlq-rows"), [], 5, "");
      dlqButtons();
      return;
    }
    if (name !== $("dlq-subscription").value) return;
    if (!dlqBusy) noted("dlq");
    const messages = answer.messages || [];
    dlqTotal = typeof answer.total === "number" ? answer.total : messages.length;
    $("dlq-summary").textContent = `${count(dlqTotal)} parked in ${name}${dlqTotal > messages.length ? ` (the first ${messages.length} shown)` : ""}`;
    const rows = messages.map((m) =>
      el(
        "tr",
        {},
        td(when(m.failed_at ?? m.failed)),
        td(m.key ?? m.group),
        td(m.id ?? m.message_id),
        td(m.attempts, "num"),
        td(m.error ?? m.reason, "wrap"),
      ),
    );
    fill($("dlq-rows"), rows, 5, "the dead-letter queue is empty");
    dlqButtons();
  }

  async function waitForJob(job) {
    while (job.status === "running") {
      await new Promise((resolve) => setTimeout(resolve, JOB_POLL_MS));
      job = await get(`/jobs/${encodeURIComponent(job.id)}`);
      const progress = job.progress || {};
      if (job.status === "running" && typeof progress.done === "number") {
        status("dlq", `replaying: ${count(progress.done)}${progress.total === null || progress.total === undefined ? "" : ` of ${count(progress.total)}`}`);
      }
    }
    return job;
  }

  async function replay() {
    const name = $("dlq-subscription").value;
    dlqBusy = true;
    dlqButtons();
    status("dlq", `replaying ${name}…`);
    try {
      const job = await waitForJob(await call("POST", `/subscriptions/${encodeURIComponent(name)}/dlq/replay`, { all: true }));
      if (job.status === "succeeded") {
        const replayed = job.result && typeof job.result.replayed === "number" ? job.result.replayed : null;
        note("dlq", replayed === null ? "replayed" : `replayed ${count(replayed)}`);
      } else {
        note("dlq", `replay failed: ${job.error || "unknown error"}`, true);
      }
    } catch (error) {
      note("dlq", error.message, true);
    } finally {
      dlqBusy = false;
    }
    await refreshDlq();
  }

  async function purge() {
    const button = $("dlq-purge");
    const name = $("dlq-subscription").value;
    if (purgeArmed === null) {
      button.textContent = `Really purge ${count(dlqTotal)}?`;
      purgeArmed = setTimeout(disarmPurge, CONFIRM_MS);
      return;
    }
    disarmPurge();
    dlqBusy = true;
    dlqButtons();
    try {
      const answer = await call("POST", `/subscriptions/${encodeURIComponent(name)}/dlq/purge`, { all: true });
      note("dlq", `purged ${count(answer.purged)}`);
    } catch (error) {
      note("dlq", error.message, true);
    } finally {
      dlqBusy = false;
    }
    await refreshDlq();
  }

  function disarmPurge() {
    clearTimeout(purgeArmed);
    purgeArmed = null;
    $("dlq-purge").textContent = "Purge all";
  }

  // ------------------------------------------------------------------ the loop

  let ticks = 0;
  let timer = null;
  let nodeShown = false;

  async function showNode() {
    try {
      const node = await get("/node");
      nodeShown = true;
      if ($("node").textContent === "connecting…") $("node").textContent = `node ${node.node}`;
      document.title = `Riverbed · ${node.node}`;
    } catch (error) {
      if (error.status !== 401) banner(`The API does not answer: ${error.message}`);
    }
  }

  // One round: the numbers always, the lists every PANELS_EVERY rounds (or now).
  // `round` makes a refresh started by hand (a token entered) the only loop.
  let round = 0;

  async function refresh(everything) {
    clearTimeout(timer);
    const mine = ++round;
    if (waitingForToken) return; // the token form starts the loop again
    if (!nodeShown) await showNode();
    if (waitingForToken || mine !== round) return;
    const jobs = [refreshStats()];
    if (everything || ticks % PANELS_EVERY === 0) {
      jobs.push(refreshSubscriptionList().then(refreshDlq), refreshClients(), refreshGroups(), refreshTopics());
    }
    await Promise.allSettled(jobs);
    if (waitingForToken || mine !== round) return;
    ticks += 1;
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    if (nodeShown) banner("");
    timer = setTimeout(() => refresh(false), STATS_EVERY_MS);
  }

  function start() {
    ratesChart = new Chart($("rates-plot"), [
      { label: "in /s", color: "#1d4e89" },
      { label: "out /s", color: "#2e9e5b", dash: [6, 4] }, // dashed: often on top of "in"
    ]);
    subscriptionChart = new Chart($("subscription-plot"), [
      { label: "lag", color: "#1d4e89" },
      { label: "retry queue", color: "#d9822b" },
      { label: "dead letters", color: "#b42318" },
    ]);
    $("token-form").addEventListener("submit", onTokenSubmit);
    $("forget-token").addEventListener("click", forgetToken);
    $("clients-search").addEventListener("input", onSearch);
    $("subscription-plotted").addEventListener("change", () => plotSubscription($("subscription-plotted").value));
    $("dlq-subscription").addEventListener("change", () => {
      disarmPurge();
      delete notes.dlq;
      refreshDlq();
    });
    $("dlq-replay").addEventListener("click", replay);
    $("dlq-purge").addEventListener("click", purge);
    showTokenButton();
    refresh(true);
  }

  start();
})();
