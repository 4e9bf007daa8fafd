// forkd TypeScript/JavaScript SDK: plain ESM for Node >= 18, no dependencies (node:http over the daemon's unix
// socket or TCP). Types: ./index.d.ts, with the API's shapes generated from /openapi.json in ./wire.d.ts.
// One casing: camelCase in JavaScript, snake_case on the wire (mapped here both ways; the keys of free-form maps
// such as labels and env are left as they are).
import fs from "node:fs";
import http from "node:http";
import https from "node:https";
import path from "node:path";
import { createInterface } from "node:readline";

import { ForkdError, InvalidInput, NotFound, Timeout, Unavailable, apiError, checked } from "./errors.js";
import { Filesystem, isChunkStream } from "./files.js";
import { built, waitJob } from "./jobs.js";

export { CommandExitError, Conflict, ControllerError, ForkdError, InvalidInput, NotFound, ProtocolViolation, Timeout,
  TimeoutError, Unavailable } from "./errors.js";
export { Filesystem, WatchHandle } from "./files.js";

const IDEMPOTENT = new Set(["GET", "HEAD", "PUT", "DELETE"]);
const CONNECT_ERRORS = new Set(["ECONNREFUSED", "ENOENT", "EAI_AGAIN", "ECONNRESET", "EPIPE"]);
const OPAQUE = new Set(["labels", "env", "envs", "metadata", "document", "body"]); // keys kept as the user wrote them

const env = (k) => (typeof process !== "undefined" ? process.env[k] : undefined);
const seg = (s) => encodeURIComponent(s);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const camel = (k) => k.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());
const snake = (k) => k.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
function mapKeys(v, f) {
  if (Array.isArray(v)) return v.map((x) => mapKeys(x, f));
  if (!v || typeof v !== "object" || v instanceof Uint8Array) return v;
  return Object.fromEntries(Object.entries(v).map(([k, x]) => [f(k), OPAQUE.has(k) ? x : mapKeys(x, f)]));
}
export const toWire = (v) => mapKeys(v, snake);
export const fromWire = (v) => mapKeys(v, camel);

/** Where the daemon is: socketPath / baseUrl options, $FORKD_URL, the local socket, else http://127.0.0.1:8889. */
export function findDaemon(opts = {}) {
  const token = opts.token ?? env("FORKD_TOKEN") ?? undefined;
  if (opts.baseUrl) return { baseUrl: opts.baseUrl.replace(/\/+$/, ""), token };
  if (opts.socketPath) return { socketPath: opts.socketPath, token };
  if (env("FORKD_URL")) return { baseUrl: env("FORKD_URL").replace(/\/+$/, ""), token };
  const sock = env("FORKD_DAEMON_SOCKET") ?? path.join(env("FORKD_HOME") ?? "/var/lib/forkd", "forkd.sock");
  if (fs.existsSync(sock)) return { socketPath: sock, token };
  const tried = ["baseUrl/socketPath options: none given", "$FORKD_URL: not set",
    `the local daemon's socket ${sock}: no such file`];
  return { baseUrl: "http://127.0.0.1:8889", token, tried };
}

function readCa(file) {
  try {
    return fs.readFileSync(file);
  } catch (e) {
    throw new InvalidInput(`FORKD_CA=${JSON.stringify(file)} is not a readable file (${e.code ?? e.message})`,
      { hint: "point FORKD_CA (or the ca option) at a PEM bundle: the daemon's --tls-cert or its CA; or unset it" });
  }
}

export class Controller {
  /** @param {{baseUrl?: string, socketPath?: string, token?: string, ca?: string, timeoutMs?: number,
   *   retries?: number}} [opts] */
  constructor(opts = {}) {
    Object.assign(this, findDaemon(opts));
    const ca = opts.ca ?? env("FORKD_CA");
    if (ca && this.baseUrl?.startsWith("https:")) this.ca = readCa(ca); // checked against it (else Node's CAs)
    this.timeoutMs = opts.timeoutMs ?? 600_000;
    this.retries = opts.retries ?? 3; // extra attempts after a connect error (any method) or a 503 (idempotent)
  }

  get where() { return this.socketPath ?? this.baseUrl; }

  // -- status
  healthz() { return this.request("GET", "/healthz"); }
  version() { return this.request("GET", "/version"); }

  // -- snapshots
  listSnapshots() { return this.request("GET", "/v1/snapshots"); }
  getSnapshot(tag) { return this.request("GET", `/v1/snapshots/${seg(tag)}`); }
  snapshotInfo(tag) { return this.request("GET", `/v1/snapshots/${seg(tag)}/info`); }
  /** Build a snapshot: the daemon runs it as a job, waited on here (`timeoutMs`; `onPhase` gets each progress
   * line); a failed build throws the error kind it failed with. */
  createSnapshot(options, wait = {}) {
    return built(this, this.request("POST", "/v1/snapshots", options, { query: { wait: "false" } }), wait);
  }
  async deleteSnapshot(tag, { cascade = false, force = false } = {}) {
    const query = {};
    if (cascade) query.cascade = "true";
    if (force) query.force = "true";
    await this.request("DELETE", `/v1/snapshots/${seg(tag)}`, undefined, { query });
  }
  compactSnapshot(tag, to, wait = {}) {
    return built(this, this.request("POST", `/v1/snapshots/${seg(tag)}/compact`, { to }, { query: { wait: "false" } }),
      wait);
  }

  // -- jobs (builds running on the daemon)
  listJobs() { return this.request("GET", "/v1/jobs"); }
  /** A job; with `waitSecs`, the daemon answers once its version is past `since` (or it is finished). */
  getJob(id, { waitSecs, since } = {}) {
    const query = {};
    if (waitSecs !== undefined) query.wait_secs = String(waitSecs);
    if (since !== undefined) query.since = String(since);
    return this.request("GET", `/v1/jobs/${seg(id)}`, undefined, { query });
  }
  /** Cancel a queued or running job: a running one answers still `running` (phase `cancelling`) and ends
   *  `cancelled` once its build has stopped (waitJob). Conflict for a finished job, naming its state. */
  cancelJob(id) { return this.request("DELETE", `/v1/jobs/${seg(id)}`); }
  /** Wait until the job is finished (long polls); Timeout after `timeoutMs` (the job keeps running). */
  waitJob(id, wait = {}) { return waitJob(this, id, wait); }

  // -- sandboxes
  /** `egress`: "none" (the daemon's default), "internet" or { allow: ["CIDR:port", ...] }. */
  spawnSandboxes({ snapshotTag, n = 1, perChildNetns = false, memoryLimitMib, labels, lifetimeSecs, egress } = {}) {
    return this.request("POST", "/v1/sandboxes",
      { snapshotTag, n, perChildNetns, memoryLimitMib, labels, lifetimeSecs, egress });
  }
  /** Keepalive: the sandbox now expires `timeoutSecs` from now. */
  setSandboxTimeout(id, timeoutSecs) {
    return this.request("POST", `/v1/sandboxes/${seg(id)}/timeout`, { timeoutSecs });
  }
  /** `n` running sandboxes continuing from this instant of `id` (a live branch; `id` keeps running). */
  forkSandbox(id, n = 1, { tag, keep, lifetimeSecs, labels, egress } = {}) {
    return this.request("POST", `/v1/sandboxes/${seg(id)}/fork`, { n, tag, keep, lifetimeSecs, labels, egress });
  }
  listSandboxes() { return this.request("GET", "/v1/sandboxes"); }
  /** A new authenticated path through the daemon to TCP `port` in the sandbox: { id, sandboxId, port, token, path };
   * the token is in this answer only (the daemon keeps its hash). */
  openPort(id, port) { return this.request("POST", `/v1/sandboxes/${seg(id)}/ports`, { port }); }
  /** The sandbox's port grants: { id, sandboxId, port, createdAt, path } (no tokens). */
  listPorts(id) { return this.request("GET", `/v1/sandboxes/${seg(id)}/ports`); }
  /** Revoke every grant of `port` (a number), or the one grant with that id (a string "g..."). */
  async closePort(id, port) {
    const which = typeof port === "number" ? String(Math.trunc(port)) : seg(port);
    await this.request("DELETE", `/v1/sandboxes/${seg(id)}/ports/${which}`);
  }
  getSandbox(id) { return this.request("GET", `/v1/sandboxes/${seg(id)}`); }
  async killSandbox(id) { await this.request("DELETE", `/v1/sandboxes/${seg(id)}`); }
  branchSandbox(id, { tag, mode = "live", wait = true } = {}) {
    return this.request("POST", `/v1/sandboxes/${seg(id)}/branch`, { tag, mode, wait });
  }
  execCommand(id, args, { timeoutSecs = 30, cwd, env: e, stdin } = {}) {
    return this.request("POST", `/v1/sandboxes/${seg(id)}/exec`, { args, timeoutSecs, cwd, env: e, stdin });
  }
  evalCode(id, code, { mode = "eval", timeoutSecs = 60 } = {}) {
    return this.request("POST", `/v1/sandboxes/${seg(id)}/eval`, { code, mode, timeoutSecs });
  }
  pingSandbox(id) { return this.request("POST", `/v1/sandboxes/${seg(id)}/ping`); }
  readFile(id, p) { return this.request("GET", `/v1/sandboxes/${seg(id)}/files`, undefined, { query: { path: p }, raw: true }); }
  writeFile(id, p, data, { mode = 0o644 } = {}) {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    return this.request("PUT", `/v1/sandboxes/${seg(id)}/files`, bytes, { query: { path: p, mode: String(mode) } });
  }

  // -- files, streamed both ways (the daemon's /v1/sandboxes/{id}/files/* routes; sb.files wraps these)
  /** Every entry under `p`, `depth` levels down (depth first, names in order), page after page, up to `maxEntries`. */
  async listFiles(id, p, { depth = 1, maxEntries = 100000 } = {}) {
    const out = [];
    let cursor;
    do {
      const page = await this.listFilesPage(id, p, { depth, cursor });
      out.push(...page.entries);
      cursor = page.nextCursor;
    } while (cursor && out.length < maxEntries);
    return out.slice(0, maxEntries);
  }
  /** One bounded page of a listing from after `cursor` ({entries, nextCursor, skipped}; nextCursor null: done). */
  listFilesPage(id, p, { depth = 1, limit, cursor } = {}) {
    const query = { path: p, depth };
    if (limit !== undefined) query.limit = limit;
    if (cursor) query.cursor = cursor;
    return this.request("GET", `${filesOf(id)}/list`, undefined, { query });
  }
  statFile(id, p) { return this.request("GET", `${filesOf(id)}/stat`, undefined, { query: { path: p } }); }
  async fileExists(id, p) {
    return (await this.request("GET", `${filesOf(id)}/exists`, undefined, { query: { path: p } })).exists;
  }
  async removeFile(id, p, { recursive = false } = {}) {
    await this.request("DELETE", filesOf(id), undefined, { query: { path: p, recursive } });
  }
  renameFile(id, src, dst) { return this.request("POST", `${filesOf(id)}/rename`, { src, dst }); }
  /** Create a directory (and its parents unless `parents` is false): true if made, false if it existed. */
  async makeDir(id, p, { parents = true, mode = 0o755 } = {}) {
    return (await this.request("POST", `${filesOf(id)}/mkdir`, { path: p, parents, mode })).created;
  }
  chmodFile(id, p, mode) { return this.request("POST", `${filesOf(id)}/chmod`, { path: p, mode }); }
  /** The file's bytes as a Node Readable (an async iterable of Buffers), streamed as the guest reads them. */
  downloadFile(id, p) { return this.open("GET", `${filesOf(id)}/content`, { query: { path: p } }); }
  /** Write `data` (a string, bytes, or a Readable / (async) iterable of chunks, sent as it is read) to `p`. */
  async uploadFile(id, p, data, { mode = 0o644, mkdir = true } = {}) {
    const body = typeof data === "string" ? Buffer.from(data, "utf8") : data;
    const resp = await this.open("PUT", `${filesOf(id)}/content`, { body, query: { path: p, mode, mkdir } });
    return fromWire(parse(await collect(resp)));
  }
  /** A watch's NDJSON answer (one WatchEvent a line) as a Readable; sb.files.watchDir reads it. */
  watchFiles(id, p, { recursive = false, timeout = 3600 } = {}) {
    return this.open("GET", `${filesOf(id)}/watch`, { query: { path: p, recursive, timeout } });
  }

  // -- processes (streamed as NDJSON events; `data` is a Uint8Array here)
  startProcess(id, { argv, cmd, env: e, cwd, user, stdin = false, pty, tag, maxOutput, timeoutSecs } = {}) {
    const body = { argv, cmd, env: e, cwd, user, stdin: stdin || undefined, pty, tag, maxOutput, timeoutSecs };
    return this.stream("POST", `/v1/sandboxes/${seg(id)}/processes`, body);
  }
  attachProcess(id, pid) { return this.stream("GET", `/v1/sandboxes/${seg(id)}/processes/${pid}/output`); }
  listProcesses(id) { return this.request("GET", `/v1/sandboxes/${seg(id)}/processes`); }
  async sendStdin(id, pid, data, { eof = false } = {}) {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    await this.request("POST", `/v1/sandboxes/${seg(id)}/processes/${pid}/stdin`,
      { data: Buffer.from(bytes).toString("base64"), eof });
  }
  async killProcess(id, pid) { return (await this.request("DELETE", `/v1/sandboxes/${seg(id)}/processes/${pid}`)).sent; }
  async signalProcess(id, pid, signal = "SIGTERM") {
    return (await this.request("POST", `/v1/sandboxes/${seg(id)}/processes/${pid}/signal`, { signal })).sent;
  }

  // -- forkd's own
  async claim(pool, n = 1, { lifetimeSecs } = {}) {
    return (await this.request("POST", `/v1/pools/${seg(pool)}/claim`, { n, lifetimeSecs })).sandboxes;
  }
  async apply(docs, { applyset = "sdk", prune = false, manager = "sdk", force = false } = {}) {
    const items = docs.map((d) => ({ document: d, source: "sdk-ts" }));
    return (await this.request("POST", "/v1/apply", { items, applyset, prune, manager, force })).changes;
  }
  listPools() { return this.request("GET", "/v1/pools"); }
  getPool(name) { return this.request("GET", `/v1/pools/${seg(name)}`); }
  async deletePool(name) { await this.request("DELETE", `/v1/pools/${seg(name)}`); }

  /** One request with retries; resolves to the camelCased JSON (or the bytes when `raw`). */
  async request(method, p, body, { query, raw = false } = {}) {
    const resp = await this.#send(method, p, body, query);
    const buf = await collect(resp);
    if (resp.statusCode >= 400) throw apiError(resp.statusCode, parse(buf), this.#url(p));
    if (raw) return new Uint8Array(buf);
    return buf.length ? fromWire(JSON.parse(buf.toString("utf8"))) : null;
  }

  /** A request whose answer is read as it arrives: resolves to the response (a Node Readable) once its status is
   * known, or throws the answer's error kind. `body` may be bytes or a Readable / (async) iterable of chunks, sent
   * with backpressure as it is read (never held whole; such a request is not retried, as it cannot be replayed). */
  async open(method, p, { body, query } = {}) {
    const resp = await this.#send(method, p, body, query, true);
    if (resp.statusCode >= 400) {
      const err = apiError(resp.statusCode, parse(await collect(resp)), this.#url(p));
      if (isChunkStream(body)) resp.req?.destroy(); // stops an upload the daemon refused
      throw err;
    }
    return resp;
  }

  /** A streamed request: an async iterator of camelCased NDJSON events. */
  async *stream(method, p, body) {
    const resp = await this.#send(method, p, body, undefined, true);
    if (resp.statusCode >= 400) throw apiError(resp.statusCode, parse(await collect(resp)), this.#url(p));
    for await (const line of createInterface({ input: resp, crlfDelay: Infinity })) {
      if (!line.trim()) continue;
      const ev = fromWire(JSON.parse(line));
      if (typeof ev.data === "string") ev.data = new Uint8Array(Buffer.from(ev.data, "base64"));
      yield ev;
    }
  }

  #url(p) { return `${this.baseUrl ?? `unix:${this.socketPath}`}${p}`; }

  async #send(method, p, body, query, streaming = false) {
    const retries = isChunkStream(body) ? 0 : this.retries; // a stream read once cannot be sent again
    for (let attempt = 0; ; attempt++) {
      try {
        const resp = await this.#once(method, p, body, query, streaming);
        if (resp.statusCode !== 503 || !IDEMPOTENT.has(method) || attempt >= retries) return resp;
        resp.resume();
      } catch (err) {
        if (!CONNECT_ERRORS.has(err.code) || attempt >= retries) {
          if (err instanceof ForkdError) throw err;
          const before = this.tried ? `; tried before it: ${this.tried.join("; ")}` : "";
          throw new Unavailable(`cannot reach the forkd daemon at ${this.where} (${attempt + 1} attempt(s)): ${err.message}${before}`,
            { url: this.#url(p), hint: "start it with 'forkd serve', or pass baseUrl/socketPath or set FORKD_URL" });
        }
      }
      await sleep(Math.min(4000, 250 * 2 ** attempt) * (0.8 + 0.4 * Math.random()));
    }
  }

  #once(method, p, body, query, streaming) {
    const qs = query && Object.keys(query).length ? `?${new URLSearchParams(query)}` : "";
    const headers = {};
    let payload;
    const chunks = isChunkStream(body) ? body : undefined;
    if (body instanceof Uint8Array || chunks) {
      headers["content-type"] = "application/octet-stream";
      payload = chunks ? undefined : body;
    } else if (body !== undefined) {
      headers["content-type"] = "application/json";
      payload = JSON.stringify(toWire(dropUndefined(body)));
    }
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    const target = this.socketPath ? { socketPath: this.socketPath, host: "forkd", path: p + qs } : (() => {
      const u = new URL(this.baseUrl + p + qs);
      return { protocol: u.protocol, hostname: u.hostname, port: u.port, path: u.pathname + u.search };
    })();
    const lib = target.protocol === "https:" ? https : http;
    return new Promise((resolve, reject) => {
      const tls = lib === https && this.ca ? { ca: this.ca } : {};
      const req = lib.request({ ...target, ...tls, method, headers }, resolve);
      req.on("error", reject);
      req.setTimeout(streaming && !chunks ? 0 : this.timeoutMs, () =>
        req.destroy(new Timeout(`${method} ${this.where}${p}: the daemon did not answer in ${this.timeoutMs} ms`)));
      if (chunks) pump(chunks, req);
      else req.end(payload);
    });
  }
}

const filesOf = (id) => `/v1/sandboxes/${seg(id)}/files`;

/** Send `chunks` into `req`, waiting whenever its buffer is full; a failure of the source fails the request. */
async function pump(chunks, req) {
  const drained = () => new Promise((resolve) => {
    const done = () => { req.off("drain", done); req.off("close", done); resolve(); };
    req.on("drain", done);
    req.on("close", done);
  });
  try {
    for await (const c of chunks) {
      if (req.destroyed) return;
      const buf = typeof c === "string" ? Buffer.from(c, "utf8") : c;
      if (!(buf instanceof Uint8Array)) throw new TypeError(`an upload chunk must be bytes or a string, not ${typeof c}`);
      if (buf.length && !req.write(buf)) await drained();
    }
    if (!req.destroyed) req.end();
  } catch (err) {
    if (req.destroyed) return;
    const e = new ForkdError(`reading the upload's data failed: ${err.message}`,
      { hint: "the upload was aborted: the daemon keeps no partial file, the destination is as it was" });
    e.cause = err;
    req.destroy(e);
  }
}

function dropUndefined(o) {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined));
}
async function collect(stream) {
  const parts = [];
  for await (const c of stream) parts.push(c);
  return Buffer.concat(parts);
}
function parse(buf) {
  const text = buf.toString("utf8");
  try { return text ? JSON.parse(text) : {}; } catch { return text; }
}

/** A started command: `pid`, `wait()` for its result, `kill()`, `sendStdin()`. */
export class CommandHandle {
  constructor(sb, events, first, { onStdout, onStderr, timeoutSecs } = {}) {
    Object.assign(this, { sandbox: sb, pid: first.pid ?? null, timeoutSecs });
    const dec = { stdout: new TextDecoder(), stderr: new TextDecoder() };
    const out = { stdout: [], stderr: [] };
    this.done = (async () => {
      for await (const ev of events) {
        if (ev.type === "stdout" || ev.type === "stderr") {
          out[ev.type].push(ev.data);
          const text = dec[ev.type].decode(ev.data, { stream: true });
          const cb = ev.type === "stdout" ? onStdout : onStderr;
          if (cb && text) cb(text);
        } else if (ev.type === "exit" || ev.type === "error") {
          return result(out, ev);
        }
      }
      return result(out, { type: "error", detail: "the stream ended early" });
    })();
  }
  /** The result; a non-zero exit throws CommandExitError, a kill by its timeout TimeoutError (E2B's), unless
   * `check` is false. */
  async wait({ check = true } = {}) {
    return checked(await this.done, check, this.timeoutSecs, `command ${this.pid} in sandbox ${this.sandbox.id}`);
  }
  kill() { return this.sandbox.controller.killProcess(this.sandbox.id, this.pid); }
  signal(sig) { return this.sandbox.controller.signalProcess(this.sandbox.id, this.pid, sig); }
  sendStdin(data, opts) { return this.sandbox.controller.sendStdin(this.sandbox.id, this.pid, data, opts); }
}

function result(out, ev) {
  const join = (xs) => Buffer.concat(xs.map((x) => Buffer.from(x)));
  const stdoutBytes = new Uint8Array(join(out.stdout));
  const stderrBytes = new Uint8Array(join(out.stderr));
  return {
    exitCode: typeof ev.exitCode === "number" ? ev.exitCode : -1,
    stdout: new TextDecoder().decode(stdoutBytes), stderr: new TextDecoder().decode(stderrBytes),
    stdoutBytes, stderrBytes, truncated: Boolean(ev.truncated), timedOut: Boolean(ev.timedOut),
    error: ev.type === "exit" ? null : (ev.detail ?? "the stream ended early"),
  };
}

/** E2B-style sandbox: `await Sandbox.create({template})` or `{pool}`; `await using` kills only what create made. */
export class Sandbox {
  constructor(info, controller, { owned = true, envs = {} } = {}) {
    Object.assign(this, { info, controller, owned, envs });
    this.urls = new Map(); // port -> the URL this object opened (the daemon shows a token once)
    this.commands = {
      run: (cmd, opts = {}) => this.#run(cmd, opts),
      list: () => controller.listProcesses(this.id),
      kill: (pid) => controller.killProcess(this.id, pid),
      sendStdin: (pid, data, opts) => controller.sendStdin(this.id, pid, data, opts),
    };
    this.files = new Filesystem(this);
  }

  get id() { return this.info.id; }
  get sandboxId() { return this.info.id; }
  get metadata() { return { ...(this.info.labels ?? {}) }; }

  /** Run `cmd` (a string through `bash -l -c` where the guest has bash, else /bin/sh -c; an array as argv), its
   * output streamed to onStdout/onStderr. As in E2B, a non-zero exit throws CommandExitError and a kill by
   * `timeoutSecs` TimeoutError (here, or from the handle's wait()), unless `check: false`. */
  async #run(cmd, { background = false, envs, cwd, user, onStdout, onStderr, timeoutSecs = 60, stdin,
    check = true } = {}) {
    const argv = Array.isArray(cmd) ? cmd : undefined;
    const env = { ...this.envs, ...(envs ?? {}) };
    const events = this.controller.startProcess(this.id, {
      argv, cmd: argv ? undefined : cmd, env: Object.keys(env).length ? env : undefined, cwd, user,
      stdin: stdin !== undefined && stdin !== false, timeoutSecs: timeoutSecs ?? undefined,
    });
    const first = (await events.next()).value ?? {};
    const handle = new CommandHandle(this, events, first, { onStdout, onStderr, timeoutSecs });
    if ((typeof stdin === "string" || stdin instanceof Uint8Array) && handle.pid !== null) {
      await handle.sendStdin(stdin, { eof: true });
    }
    return background ? handle : handle.wait({ check });
  }

  /** `timeout`: seconds it lives (default: a pool's child.ttlSeconds, else the daemon's FORKD_SANDBOX_TIMEOUT).
   * `egress` / `allowInternetAccess` (E2B's name: true is egress "internet"): what it may reach; unlike E2B,
   * nothing unless asked (the template must be built with network isolated; a pool's children have its egress). */
  static async create({ template, pool, envs, metadata, timeout, egress, allowInternetAccess, controller,
    ...opts } = {}) {
    if ((template === undefined) === (pool === undefined)) {
      throw new Error("Sandbox.create needs exactly one of template (a snapshot tag) or pool");
    }
    if (allowInternetAccess !== undefined) {
      if (egress !== undefined) throw new Error("Sandbox.create takes egress or allowInternetAccess, not both");
      egress = allowInternetAccess ? "internet" : "none";
    }
    if (pool !== undefined && egress !== undefined) {
      throw new Error(`a sandbox claimed from pool ${JSON.stringify(pool)} has the pool's egress (child.egress)`);
    }
    const ctrl = controller ?? new Controller(opts);
    const [info] = pool !== undefined ? await ctrl.claim(pool, 1, { lifetimeSecs: timeout })
      : await ctrl.spawnSandboxes({ snapshotTag: template, labels: metadata, lifetimeSecs: timeout, egress });
    return new Sandbox(info, ctrl, { owned: true, envs });
  }

  /** Keepalive: this sandbox now expires `seconds` from now. */
  async setTimeout(seconds) {
    this.info = await this.controller.setSandboxTimeout(this.id, seconds);
    return this.info;
  }

  /** `n` sandboxes continuing from this instant (this one keeps running); each is killed when disposed. */
  async fork(n = 1, { timeout, keep, tag, metadata, egress } = {}) {
    const infos = await this.controller.forkSandbox(this.id, n,
      { tag, keep, lifetimeSecs: timeout, labels: metadata, egress });
    return infos.map((info) => new Sandbox(info, this.controller, { owned: true, envs: this.envs }));
  }

  /** Attach to a running sandbox: `await using` / dispose never kills it. */
  static async connect(id, { controller, envs, ...opts } = {}) {
    const ctrl = controller ?? new Controller(opts);
    return new Sandbox(await ctrl.getSandbox(id), ctrl, { owned: false, envs });
  }

  /** The daemon's running sandboxes, those whose labels include every `metadata` pair when given. */
  static async list({ metadata, controller, ...opts } = {}) {
    const ctrl = controller ?? new Controller(opts);
    const want = Object.entries(metadata ?? {});
    return (await ctrl.listSandboxes()).filter((s) => want.every(([k, v]) => (s.labels ?? {})[k] === v));
  }

  eval(code, opts) { return this.controller.evalCode(this.id, code, opts); }
  runCode(code, opts = {}) { return this.controller.evalCode(this.id, code, { ...opts, mode: "exec" }); }
  ping() { return this.controller.pingSandbox(this.id); }
  branch(opts) { return this.controller.branchSandbox(this.id, opts); }
  kill() { return this.controller.killSandbox(this.id); }
  /** A URL through the daemon to TCP `port` in this sandbox (a token for that port only; closePort revokes it).
   * The first call for a port opens it; later ones give the same URL. */
  async getUrl(port) {
    if (!this.urls.has(port)) {
      const grant = await this.controller.openPort(this.id, port);
      this.urls.set(port, `${this.controller.baseUrl ?? "http://forkd"}${grant.path}`);
    }
    return this.urls.get(port);
  }
  /** E2B's getHost: getUrl without its scheme. */
  async getHost(port) { return (await this.getUrl(port)).split("://")[1]; }
  closePort(port) { this.urls.delete(port); return this.controller.closePort(this.id, port); }
  async [Symbol.asyncDispose ?? Symbol.for("Symbol.asyncDispose")]() {
    if (!this.owned) return;
    try { await this.kill(); } catch (e) { if (!(e instanceof NotFound)) throw e; }
  }
}
