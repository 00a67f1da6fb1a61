// ctxlake web UI: small vanilla JS, no build step, no inline script (the CSP forbids it).
"use strict";

(function () {
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const project = document.body.dataset.project || "";

  function withProject(params) {
    const p = new URLSearchParams(params);
    if (project) p.set("project", project);
    return p.toString();
  }

  async function getJSON(url, signal) {
    const res = await fetch(url, { signal, headers: { Accept: "application/json" } });
    const data = await res.json().catch(() => ({ error: "bad response (" + res.status + ")" }));
    if (!res.ok) throw new Error(data.error + (data.hint ? " — " + data.hint : ""));
    return data;
  }

  async function postJSON(url, body) {
    const res = await fetch(url + "?" + withProject({}), {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
      body: JSON.stringify(body || {}),
    });
    const data = await res.json().catch(() => ({ error: "refused (" + res.status + ")" }));
    if (!res.ok) throw new Error(data.error + (data.hint ? " — " + data.hint : ""));
    return data;
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = v;
      else if (k === "class") node.className = v;
      else node.setAttribute(k, v);
    }
    for (const c of children) if (c !== null && c !== undefined) node.append(c);
    return node;
  }

  function fmtBytes(n) {
    if (!n) return "0 B";
    const u = ["B", "KB", "MB", "GB", "TB"];
    const i = Math.min(u.length - 1, Math.floor(Math.log(n) / Math.log(1024)));
    return (n / Math.pow(1024, i)).toFixed(i ? 1 : 0) + " " + u[i];
  }

  function fmtTime(iso) {
    if (!iso) return "—";
    return String(iso).replace("T", " ").slice(0, 16);
  }

  // Highlight query words in text without ever parsing it as HTML.
  function highlight(text, query) {
    const frag = document.createDocumentFragment();
    const words = (query.match(/[\p{L}\p{N}_]{2,}/gu) || []).map((w) => w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
    if (!words.length) { frag.append(text); return frag; }
    const re = new RegExp("(" + words.join("|") + ")", "giu");
    let last = 0;
    for (const m of text.matchAll(re)) {
      if (m.index > last) frag.append(text.slice(last, m.index));
      frag.append(el("mark", { text: m[0] }));
      last = m.index + m[0].length;
    }
    if (last < text.length) frag.append(text.slice(last));
    return frag;
  }

  function table(headers, rows) {
    const t = el("table", { class: "grid" });
    t.append(el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", { scope: "col", text: h })))));
    const tb = el("tbody");
    for (const r of rows) tb.append(el("tr", {}, ...r.map((c) => (c instanceof Node ? el("td", {}, c) : el("td", { text: String(c) })))));
    t.append(tb);
    return t;
  }

  // -- shared: the project selector submits itself -------------------------------------------------
  for (const sel of document.querySelectorAll("select[data-autosubmit]")) {
    sel.addEventListener("change", () => sel.form.submit());
  }
  for (const btn of document.querySelectorAll("button[data-copy]")) {
    btn.addEventListener("click", async () => {
      const text = document.getElementById(btn.dataset.copy).textContent;
      try { await navigator.clipboard.writeText(text); btn.textContent = "Copied"; } catch (e) { btn.textContent = "Select and copy"; }
    });
  }

  // -- Overview ------------------------------------------------------------------------------------
  async function overview() {
    const state = document.getElementById("overview-state");
    let data;
    try { data = await getJSON("/api/overview?" + withProject({})); } catch (e) { state.textContent = e.message; state.classList.add("error"); return; }
    const projects = document.getElementById("projects");
    for (const p of data.projects) {
      const box = el("article", { class: "card" }, el("h3", { text: p.root }));
      if (p.error) { box.append(el("p", { class: "error", text: p.error })); projects.append(box); continue; }
      const st = p.status;
      const share = st.chunks ? Math.round((100 * st.embedded) / st.chunks) + "%" : "—";
      box.append(el("dl", { class: "facts" },
        el("dt", { text: "Files" }), el("dd", { text: st.files.toLocaleString() }),
        el("dt", { text: "Chunks" }), el("dd", { text: st.chunks.toLocaleString() }),
        el("dt", { text: "Embedded" }), el("dd", { text: share }),
        el("dt", { text: "Lake size" }), el("dd", { text: fmtBytes(st.lake_bytes) }),
        el("dt", { text: "Stale files" }), el("dd", { text: String(st.stale_count), class: st.stale_count ? "warn" : "" }),
        el("dt", { text: "Model" }), el("dd", { text: st.model_id || "—" }),
      ));
      if (!st.indexed) box.append(el("p", { class: "muted", text: "Not indexed yet: ctx run index" }));
      if (p.sources.length) {
        box.append(table(["Source", "Type", "Files", "Chunks", "Embedded", "Last indexed", "Status"], p.sources.map((s) => [
          s.name, s.type || "—", s.files.toLocaleString(), s.chunks.toLocaleString(),
          s.chunks ? Math.round((100 * s.embedded) / s.chunks) + "%" : "—", fmtTime(s.last_indexed || s.updated_at), s.status || "indexed",
        ])));
      }
      projects.append(box);
    }
    const sched = document.getElementById("schedules");
    if (data.schedules_error) sched.append(el("p", { class: "error", text: data.schedules_error }));
    else if (!data.schedules.length) sched.append(el("p", { class: "muted", text: data.service ? "No schedules (the orchestrator is starting, or [service] schedules = false)." : "Schedules run in the service (ctx up)." }));
    else sched.append(table(["Flow", "Schedule", "Next", "Last run"], data.schedules.map((s) => [
      s.name + (s.paused ? " (paused)" : ""), (s.kind || "") + " " + (s.spec || ""), fmtTime(s.next_run),
      ((s.last_run || {}).state || "—") + " " + fmtTime((s.last_run || {}).end),
    ])));
    const ing = document.getElementById("ingestion");
    const tools = data.ingestion.tools || [];
    if (!tools.length) ing.append(el("p", { class: "muted", text: "No conversations ingested yet (ctx run ingest)." }));
    else {
      ing.append(table(["Tool", "Sessions", "Messages", "Newest message", "Malformed"], tools.map((t) => [
        t.tool, t.sessions.toLocaleString(), t.messages.toLocaleString(), fmtTime(t.last_message),
        Object.entries(t.malformed || {}).map(([k, v]) => k + ": " + v).join(", ") || "0",
      ])));
      ing.append(el("p", { class: "muted", text: "Last ingest: " + fmtTime(data.ingestion.last_ingest) }));
    }
    const recent = document.getElementById("recent");
    for (const s of data.recent_sessions) {
      recent.append(el("li", {},
        el("time", { datetime: s.last_active, text: fmtTime(s.last_active) }), " ",
        el("span", { class: "badge", text: s.tool }), " ",
        el("a", { href: "/sessions/" + encodeURIComponent(s.session_ref) + "?" + withProject({}), text: s.title || s.session_ref }),
        el("span", { class: "muted", text: " " + s.n_messages + " messages" })));
    }
    if (!data.recent_sessions.length) recent.append(el("li", { class: "muted", text: "No sessions yet." }));
    state.textContent = "";
    document.body.dataset.ready = "1";
  }

  // -- Search --------------------------------------------------------------------------------------
  function search() {
    const form = document.getElementById("search-form");
    const results = document.getElementById("results");
    const status = document.getElementById("search-status");
    let timer = null, controller = null, seq = 0;

    function params() {
      const p = {};
      for (const input of form.querySelectorAll("input, select")) if (input.value.trim()) p[input.name] = input.value.trim();
      return p;
    }

    async function run() {
      const p = params();
      const mine = ++seq;
      if (controller) controller.abort();
      if (!p.q) { results.replaceChildren(); status.textContent = ""; results.dataset.state = "idle"; return; }
      controller = new AbortController();
      results.dataset.state = "loading";
      const t0 = performance.now();
      let data;
      try { data = await getJSON("/api/search?" + withProject(p), controller.signal); }
      catch (e) {
        if (e.name === "AbortError") return;
        if (mine !== seq) return;
        results.replaceChildren(el("p", { class: "error", role: "alert", text: e.message }));
        results.dataset.state = "error"; return;
      }
      if (mine !== seq) return;
      render(data, p.q);
      const n = results.querySelectorAll(".hit").length;
      status.textContent = n + " result" + (n === 1 ? "" : "s") + " in " + Math.round(performance.now() - t0) + " ms";
      results.dataset.seq = String(mine);
      results.dataset.q = p.q;
      results.dataset.state = "done";
    }

    function render(data, q) {
      const out = [];
      for (const w of data.warnings || []) out.push(el("p", { class: "notice", text: w }));
      const code = data.code;
      if (code) {
        for (const w of code.warnings || []) out.push(el("p", { class: "notice", text: w }));
        if (code.hits.length) out.push(el("h2", { class: "group", text: "Code and docs" }));
        for (const h of code.hits) {
          const loc = h.path + ":" + h.start_line + "-" + h.end_line;
          const open = el("button", { type: "button", class: "hit-open", "data-path": h.path, "data-start": h.start_line, "data-end": h.end_line, "data-source": h.source },
            el("span", { class: "hit-symbol", text: h.symbol || h.kind }), " ", el("span", { class: "hit-loc", text: loc }));
          out.push(el("article", { class: "hit card", "data-path": h.path },
            el("div", { class: "card-head" }, open, " ", el("span", { class: "badge", text: h.lang || h.kind }),
              h.source !== "project" ? el("span", { class: "badge", text: h.source }) : null),
            el("pre", { class: "snippet" }, highlight(h.snippet, q))));
        }
      }
      const ctx = data.context;
      if (ctx) {
        for (const w of ctx.warnings || []) out.push(el("p", { class: "notice", text: w }));
        if (ctx.hits.length) out.push(el("h2", { class: "group", text: "Conversations and knowledge" }));
        for (const h of ctx.hits) {
          const link = h.session_ref ? el("a", { href: "/sessions/" + encodeURIComponent(h.session_ref) + "?" + withProject({}), text: h.title || h.session_ref })
            : el("a", { href: "/knowledge?" + withProject({}) + "#k-" + h.ref, text: h.title || h.ref });
          out.push(el("article", { class: "hit card" },
            el("div", { class: "card-head" }, el("span", { class: "badge t-" + h.type, text: h.type }), " ", link,
              el("span", { class: "muted", text: " " + (h.tool || "") + " " + fmtTime(h.timestamp) })),
            el("pre", { class: "snippet" }, highlight(h.text.slice(0, 600), q))));
        }
      }
      if (!out.some((n) => n.classList && n.classList.contains("hit"))) out.push(el("p", { class: "muted", text: "No results." }));
      results.replaceChildren(...out);
    }

    form.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(run, 120); });
    form.addEventListener("change", () => { clearTimeout(timer); timer = setTimeout(run, 0); });
    form.addEventListener("submit", (e) => { e.preventDefault(); clearTimeout(timer); run(); });

    // File viewer: opens at the hit, lines numbered, the hit's lines marked.
    const viewer = document.getElementById("viewer");
    const code = document.getElementById("viewer-code");
    results.addEventListener("click", async (e) => {
      const btn = e.target.closest(".hit-open");
      if (!btn) return;
      const path = btn.dataset.path, start = +btn.dataset.start, end = +btn.dataset.end;
      viewer.hidden = false;
      document.getElementById("viewer-path").textContent = path + ":" + start + "-" + end;
      const note = document.getElementById("viewer-note");
      note.textContent = "";
      code.replaceChildren();
      if (btn.dataset.source !== "project") { note.textContent = "Files of other sources open in their own project; the snippet is above."; return; }
      const from = Math.max(1, start - 20);
      let data;
      try { data = await getJSON("/api/file?" + withProject({ path, start: from, end: end + 20 })); }
      catch (err) { note.textContent = err.message; return; }
      const lines = data.content.split("\n");
      if (lines.length && lines[lines.length - 1] === "") lines.pop();
      let target = null;
      lines.forEach((line, i) => {
        const n = data.start_line + i;
        const row = el("span", { class: "line" + (n >= start && n <= end ? " hit-line" : ""), "data-line": n },
          el("span", { class: "ln", "aria-hidden": "true", text: String(n) }), line + "\n");
        if (n === start) target = row;
        code.append(row);
      });
      note.textContent = (data.warnings || []).join("; ") + (data.total_lines ? " (" + data.total_lines + " lines)" : "");
      viewer.dataset.path = path;
      if (target) target.scrollIntoView({ block: "center" });
      code.focus();
    });
    document.getElementById("viewer-close").addEventListener("click", () => { viewer.hidden = true; });

    const filesForm = document.getElementById("files-form");
    filesForm.addEventListener("submit", async (e) => {
      e.preventDefault();
      const list = document.getElementById("files-list");
      list.replaceChildren(el("li", { class: "muted", text: "Ranking…" }));
      try {
        const data = await getJSON("/api/files?" + withProject({ q: filesForm.q.value }));
        list.replaceChildren(...data.files.map((f) => el("li", {},
          el("button", { type: "button", class: "hit-open link", "data-path": f.path, "data-start": f.start_line || 1, "data-end": f.end_line || 1, "data-source": f.source },
            el("span", { class: "hit-loc", text: f.path })),
          f.symbol ? el("span", { class: "muted", text: " " + f.symbol }) : null)));
        if (!data.files.length) list.replaceChildren(el("li", { class: "muted", text: "No files matched." }));
      } catch (err) { list.replaceChildren(el("li", { class: "error", text: err.message })); }
    });
    // Files ranked below open in the same viewer.
    document.getElementById("files-list").addEventListener("click", (e) => {
      const btn = e.target.closest(".hit-open");
      if (!btn) return;
      const clone = btn.cloneNode(true);
      clone.hidden = true;
      results.append(clone);
      clone.click();
      clone.remove();
    });
    const q = new URLSearchParams(location.search).get("q");
    if (q) { form.q.value = q; run(); }
  }

  // -- Knowledge -----------------------------------------------------------------------------------
  function knowledge() {
    const msg = document.getElementById("knowledge-msg");
    function say(text, bad) { msg.hidden = false; msg.textContent = text; msg.classList.toggle("error", !!bad); msg.focus(); }
    function outcome(r) {
      if (r.status === "duplicate") return ["Refused: duplicate of " + r.similar_to + " (similarity " + r.similarity.toFixed(2) + "). Nothing was written.", true];
      if (r.status === "superseded") return ["Saved " + r.id + "; it supersedes " + r.similar_to + " (similarity " + r.similarity.toFixed(2) + ").", false];
      return ["Saved " + r.id + " (" + r.path + "). It is searchable after the next ingest.", false];
    }
    const form = document.getElementById("knowledge-form");
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      try {
        const r = await postJSON("/api/knowledge", { type: form.type.value, title: form.title.value, body: form.body.value, tags: form.tags.value });
        const [text, bad] = outcome(r);
        say(text, bad);
        if (!bad) setTimeout(() => location.reload(), 900);
      } catch (err) { say(err.message, true); }
    });
    document.getElementById("knowledge-list").addEventListener("click", async (e) => {
      const del = e.target.closest("[data-delete]");
      const edit = e.target.closest("[data-edit]");
      if (del) {
        if (!confirm("Delete this record's file? The version it replaced (if any) becomes current again.")) return;
        try { const r = await postJSON("/api/knowledge/" + encodeURIComponent(del.dataset.delete) + "/delete", {}); say("Deleted " + r.path + ". The index drops it at the next ingest.", false); del.closest("li").remove(); }
        catch (err) { say(err.message, true); }
      } else if (edit) {
        const card = edit.closest("li");
        if (card.querySelector("form")) return;
        const title = card.querySelector(".k-title").textContent;
        const body = card.querySelector(".k-body") ? card.querySelector(".k-body").textContent : "";
        const id = edit.dataset.edit;
        const f = el("form", { class: "stack" },
          el("label", { for: "e-title-" + id, text: "Title" }), el("input", { id: "e-title-" + id, name: "title", value: title }),
          el("label", { for: "e-body-" + id, text: "Body" }), el("textarea", { id: "e-body-" + id, name: "body", rows: "4" }),
          el("button", { type: "submit", text: "Save new version" }));
        f.body.value = body;
        card.append(f);
        f.title.focus();
        f.addEventListener("submit", async (ev) => {
          ev.preventDefault();
          try {
            const r = await postJSON("/api/knowledge/" + encodeURIComponent(id) + "/edit", { title: f.title.value, body: f.body.value });
            const [text, bad] = outcome(r);
            say(text, bad);
            if (!bad) setTimeout(() => location.reload(), 900);
          } catch (err) { say(err.message, true); }
        });
      }
    });
  }

  // -- Sources -------------------------------------------------------------------------------------
  function sources() {
    const box = document.getElementById("job");
    async function follow(job) {
      box.hidden = false;
      document.getElementById("job-title").textContent = job.title;
      const stateEl = document.getElementById("job-state");
      for (;;) {
        stateEl.textContent = job.state;
        stateEl.className = "badge s-" + job.state;
        box.dataset.state = job.state;
        document.getElementById("job-elapsed").textContent = job.elapsed_s + " s";
        document.getElementById("job-lines").textContent = job.lines.join("\n");
        if (job.state === "done" || job.state === "failed") break;
        await new Promise((r) => setTimeout(r, 500));
        try { job = await getJSON("/api/jobs/" + job.id); } catch (err) { stateEl.textContent = err.message; return; }
      }
      if (job.state === "done") setTimeout(() => location.reload(), 600);
    }
    const form = document.getElementById("source-form");
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      try {
        follow(await postJSON("/api/sources", { name: form.name.value, origin: form.origin.value, type: form.type.value, docs: form.docs.checked }));
      } catch (err) { box.hidden = false; document.getElementById("job-lines").textContent = err.message; document.getElementById("job-state").textContent = "refused"; }
    });
    document.getElementById("sources-table").addEventListener("click", async (e) => {
      const btn = e.target.closest("[data-source-action]");
      if (!btn) return;
      if (btn.dataset.sourceAction === "remove" && !confirm("Remove " + btn.dataset.name + " and its rows from the index?")) return;
      try { follow(await postJSON("/api/sources/" + encodeURIComponent(btn.dataset.name) + "/" + btn.dataset.sourceAction, {})); }
      catch (err) { box.hidden = false; document.getElementById("job-lines").textContent = err.message; }
    });
  }

  // -- Settings ------------------------------------------------------------------------------------
  async function settings() {
    const box = document.getElementById("schedules-box");
    if (!box) { document.body.dataset.ready = "1"; return; }
    const msg = document.getElementById("schedule-msg");
    function say(text, bad) { msg.hidden = false; msg.textContent = text; msg.classList.toggle("error", !!bad); }
    function render(schedules) {
      box.replaceChildren();
      if (!schedules.length) {
        box.append(el("p", { class: "muted", text: "No schedules (the orchestrator is starting, or [service] schedules = false)." }));
        return;
      }
      const body = el("tbody");
      schedules.forEach((s, i) => {
        const id = "every-" + (i + 1);
        body.append(el("tr", {},
          el("th", { scope: "row", text: s.name }), el("td", { text: (s.kind || "") + " " + (s.spec || "") }),
          el("td", { text: s.paused ? "paused" : "active" }), el("td", { text: s.next_run || "—" }),
          el("td", { text: ((s.last_run || {}).state || "—") + " " + ((s.last_run || {}).end || "") }),
          el("td", {},
            el("button", { type: "button", "data-schedule": s.name, "data-action": s.paused ? "resume" : "pause", text: s.paused ? "Resume" : "Pause" }), " ",
            el("label", { for: id, class: "sr", text: "Interval for " + s.name }),
            el("input", { id, size: "6", placeholder: "10m", "data-every-for": s.name }), " ",
            el("button", { type: "button", "data-schedule": s.name, "data-action": "every", text: "Set interval" }))));
      });
      box.append(el("table", { class: "grid", id: "schedules-table" },
        el("thead", {}, el("tr", {}, ...["Flow", "Schedule", "State", "Next run", "Last run", "Change"].map((h) => el("th", { scope: "col", text: h })))),
        body));
    }
    box.addEventListener("click", async (e) => {
      const btn = e.target.closest("[data-schedule]");
      if (!btn) return;
      const body = { action: btn.dataset.action };
      if (body.action === "every") body.every = box.querySelector('[data-every-for="' + CSS.escape(btn.dataset.schedule) + '"]').value;
      try { render((await postJSON("/api/schedules/" + encodeURIComponent(btn.dataset.schedule), body)).schedules); say("Saved: " + btn.dataset.schedule); }
      catch (err) { say(err.message, true); }
    });
    try { render((await getJSON("/api/schedules?" + withProject({}))).schedules); }
    catch (err) { box.replaceChildren(el("p", { class: "notice error", text: err.message })); }
    box.removeAttribute("aria-busy");
    document.body.dataset.ready = "1";
  }

  const pages = { overview, search, knowledge, sources, settings };
  const init = pages[document.body.dataset.page];
  if (init) init();
})();
