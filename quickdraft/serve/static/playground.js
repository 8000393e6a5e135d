// The quickdraft playground: streams POST /v1/quickdraft/steps (server-sent events, one `step`
// per target pass, then `done`) and draws each pass: accepted drafts, rejected drafts struck
// through, and the token the target added (recovered after a rejection, bonus after a full accept).
"use strict";

const $ = (id) => document.getElementById(id);
let server = null; // GET /v1/quickdraft/info

function headers() {
  const key = $("api-key").value.trim();
  return Object.assign({"content-type": "application/json"}, key ? {authorization: `Bearer ${key}`} : {});
}

async function connect() {
  const response = await fetch("/v1/quickdraft/info", {headers: headers()});
  if (!response.ok) {
    $("server").textContent = response.status === 401 ? "this server needs an API key: enter it, then start" :
      `server answered ${response.status}`;
    return false;
  }
  server = await response.json();
  $("server").textContent = `${server.model} · ${server.backend} backend · ${server.precision} · ${server.device}`;
  const select = $("method");
  select.replaceChildren(...server.methods.filter((m) => m !== "draft" || server.draft_model).map((m) => {
    const option = document.createElement("option");
    option.value = option.textContent = m;
    option.selected = m === server.method;
    return option;
  }));
  return true;
}

function token(text, kind) {
  const span = document.createElement("span");
  span.className = `token ${kind}`;
  span.textContent = text.replace(/\n/g, "\u21b5") || "\u2205"; // a newline as an arrow; a token with no text (EOS) as an empty-set sign
  return span;
}

// Draft tokens the pass did not keep: a chain's after the accepted prefix; a tree's off the kept path.
function rejectedTexts(step) {
  if (!step.tree) return step.draft_texts.slice(step.accepted);
  const kept = step.emitted.slice(0, step.accepted);
  return step.draft_tokens.flatMap((id, i) => {
    const at = kept.indexOf(id);
    if (at >= 0) { kept.splice(at, 1); return []; }
    return [step.draft_texts[i]];
  });
}

class View {
  constructor(name) {
    this.steps = $(name);
    this.stats = $(`${name}-stats`);
    this.text = $(`${name}-text`);
    this.clock = $(`${name}-clock`);
  }

  reset() {
    this.steps.replaceChildren();
    this.text.textContent = this.stats.textContent = this.clock.textContent = "";
    this.passes = this.tokens = this.drafted = this.accepted = 0;
    this.started = performance.now();
    this.finished = null;
    this.tick();
  }

  tick() {
    const end = this.finished ?? performance.now();
    this.clock.textContent = `${((end - this.started) / 1000).toFixed(2)} s`;
    if (this.finished === null) requestAnimationFrame(() => this.tick());
  }

  step(step) {
    const box = document.createElement("span");
    box.className = "step";
    for (const text of step.accepted_texts) box.append(token(text, "accepted"));
    for (const text of rejectedTexts(step)) box.append(token(text, "rejected"));
    const kind = step.draft_tokens.length === 0 ? "target" : step.bonus ? "bonus" : "recovered";
    box.append(token(step.next_text, kind));
    this.steps.append(box);
    this.steps.scrollTop = this.steps.scrollHeight;
    this.text.textContent += step.text;
    this.passes += 1;
    this.tokens += step.emitted.length;
    this.drafted += step.draft_tokens.length;
    this.accepted += step.accepted;
    this.show();
  }

  show(final) {
    const seconds = ((this.finished ?? performance.now()) - this.started) / 1000;
    const alpha = this.drafted ? `${(100 * this.accepted / this.drafted).toFixed(1)}%` : "-";
    const rate = final ? final.tokens_per_second : this.tokens / seconds;
    this.stats.textContent = `${this.passes} passes · ${(this.tokens / Math.max(1, this.passes)).toFixed(2)} tokens ` +
      `per pass · acceptance ${alpha} · ${rate.toFixed(1)} tok/s`;
  }

  done(result) {
    this.finished = performance.now();
    this.text.textContent = result.text;
    this.show(result.quickdraft);
  }
}

const views = {speculative: new View("speculative"), plain: new View("plain")};

async function run(view, method) {
  const body = {
    model: server.model,
    messages: [{role: "user", content: $("prompt").value}],
    max_tokens: Number($("max-tokens").value),
    temperature: Number($("temperature").value),
    quickdraft: {method},
  };
  if (method !== "none" && $("k").value) body.quickdraft.k = Number($("k").value);
  view.reset();
  const response = await fetch("/v1/quickdraft/steps", {method: "POST", headers: headers(), body: JSON.stringify(body)});
  if (!response.ok) throw new Error((await response.json()).error?.message ?? `server answered ${response.status}`);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, {stream: true});
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const event = /^event: (.*)$/m.exec(block)?.[1];
      const data = JSON.parse(/^data: (.*)$/m.exec(block)[1]);
      if (event === "step") view.step(data);
      else if (event === "done") view.done(data);
      else if (event === "error") throw new Error(data.error?.message ?? "the server reported an error");
    }
  }
}

async function start(race) {
  const status = $("status");
  status.className = "";
  if (!server && !(await connect())) return;
  for (const button of document.querySelectorAll("button")) button.disabled = true;
  $("plain-pane").classList.toggle("hidden", !race);
  status.textContent = race ? "racing..." : "decoding...";
  try {
    const method = $("method").value;
    const runs = [run(views.speculative, method)];
    if (race) runs.push(run(views.plain, "none"));
    await Promise.all(runs);
    status.textContent = race ? `done: ${method} ${views.speculative.clock.textContent}, plain ${views.plain.clock.textContent}` :
      "done";
  } catch (error) {
    status.className = "error";
    status.textContent = error.message;
    for (const view of Object.values(views)) if (view.finished === null) view.finished = performance.now();
  } finally {
    for (const button of document.querySelectorAll("button")) button.disabled = false;
  }
}

$("controls").addEventListener("submit", (event) => { event.preventDefault(); start(false); });
$("race").addEventListener("click", () => start(true));
connect();
