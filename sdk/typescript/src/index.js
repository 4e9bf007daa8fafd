// forkd TypeScript/JavaScript SDK: plain ESM, no dependencies beyond the global fetch (Node >= 18).
// Types: ./index.d.ts. Method names follow upstream forkd's TypeScript SDK.

/** A non-2xx answer: `status`, `body` (problem+json), `detail`. */
export class ControllerError extends Error {
  constructor(status, body, url) {
    const detail = body && typeof body === "object" ? body.detail ?? body.error : String(body);
    super(`controller ${url}: HTTP ${status}: ${detail}`);
    this.name = "ControllerError";
    this.status = status;
    this.body = body;
    this.url = url;
    this.detail = detail;
  }
}

const env = (k) => (typeof process !== "undefined" ? process.env[k] : undefined);
const seg = (s) => encodeURIComponent(s);

export class Controller {
  /** @param {{baseUrl?: string, token?: string, timeoutMs?: number, fetch?: typeof fetch}} [opts] */
  constructor(opts = {}) {
    this.baseUrl = (opts.baseUrl ?? env("FORKD_URL") ?? "http://127.0.0.1:8889").replace(/\/+$/, "");
    this.token = opts.token ?? env("FORKD_TOKEN") ?? undefined;
    this.timeoutMs = opts.timeoutMs ?? 600_000;
    this.fetchImpl = opts.fetch ?? globalThis.fetch;
    if (typeof this.fetchImpl !== "function") throw new Error("Controller: no fetch; pass opts.fetch");
  }

  // -- status
  healthz() { return this.request("GET", "/healthz"); }
  version() { return this.request("GET", "/version"); }

  // -- snapshots
  listSnapshots() { return this.request("GET", "/v1/snapshots"); }
  getSnapshot(tag) { return this.request("GET", `/v1/snapshots/${seg(tag)}`); }
  snapshotInfo(tag) { return this.request("GET", `/v1/snapshots/${seg(tag)}/info`); }
  createSnapshot(options) { return this.request("POST", "/v1/snapshots", options); }
  async deleteSnapshot(tag, { cascade = false, force = false } = {}) {
    const q = new URLSearchParams();
    if (cascade) q.set("cascade", "true");
    if (force) q.set("force", "true");
    const qs = q.toString();
    await this.request("DELETE", `/v1/snapshots/${seg(tag)}${qs ? `?${qs}` : ""}`);
  }
  compactSnapshot(tag, to) { return this.request("POST", `/v1/snapshots/${seg(tag)}/compact`, { to }); }

  // -- sandboxes
  spawnSandboxes({ snapshotTag, n = 1, perChildNetns = false, memoryLimitMib } = {}) {
    const body = { snapshot_tag: snapshotTag, n, per_child_netns: perChildNetns };
    if (memoryLimitMib !== undefined) body.memory_limit_mib = memoryLimitMib;
    return this.request("POST", "/v1/sandboxes", body);
  }
  listSandboxes() { return this.request("GET", "/v1/sandboxes"); }
  getSandbox(id) { return this.request("GET", `/v1/sandboxes/${seg(id)}`); }
  async killSandbox(id) { await this.request("DELETE", `/v1/sandboxes/${seg(id)}`); }
  branchSandbox(id, { tag, mode = "live", wait = true, diff } = {}) {
    const body = { mode: diff ? "diff" : mode, wait };
    if (tag !== undefined) body.tag = tag;
    return this.request("POST", `/v1/sandboxes/${seg(id)}/branch`, body);
  }
  execCommand(id, args, { timeoutSecs = 30, cwd, env: e } = {}) {
    const body = { args, timeout_secs: timeoutSecs };
    if (cwd !== undefined) body.cwd = cwd;
    if (e !== undefined) body.env = e;
    return this.request("POST", `/v1/sandboxes/${seg(id)}/exec`, body);
  }
  evalCode(id, code, { mode = "eval", timeoutSecs = 60 } = {}) {
    return this.request("POST", `/v1/sandboxes/${seg(id)}/eval`, { code, mode, timeout_secs: timeoutSecs });
  }
  pingSandbox(id) { return this.request("POST", `/v1/sandboxes/${seg(id)}/ping`); }
  async readFile(id, path) {
    const buf = await this.request("GET", `/v1/sandboxes/${seg(id)}/files?path=${seg(path)}`, undefined, true);
    return new Uint8Array(buf);
  }
  writeFile(id, path, data) {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    return this.request("PUT", `/v1/sandboxes/${seg(id)}/files?path=${seg(path)}`, bytes);
  }

  // -- forkd's own
  async claim(pool, n = 1) {
    return (await this.request("POST", `/v1/pools/${seg(pool)}/claim`, { n })).sandboxes;
  }
  async apply(docs, { applyset = "sdk", prune = false, manager = "sdk", force = false } = {}) {
    const items = docs.map((d) => ({ document: d, source: "sdk-ts" }));
    return (await this.request("POST", "/v1/apply", { items, applyset, prune, manager, force })).changes;
  }
  listPools() { return this.request("GET", "/v1/pools"); }
  getPool(name) { return this.request("GET", `/v1/pools/${seg(name)}`); }
  async deletePool(name) { await this.request("DELETE", `/v1/pools/${seg(name)}`); }

  async request(method, path, body, raw = false) {
    const url = `${this.baseUrl}${path}`;
    const headers = {};
    let payload;
    if (body instanceof Uint8Array) {
      headers["content-type"] = "application/octet-stream";
      payload = body;
    } else if (body !== undefined) {
      headers["content-type"] = "application/json";
      payload = JSON.stringify(body);
    }
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), this.timeoutMs);
    try {
      const resp = await this.fetchImpl(url, { method, headers, body: payload, signal: ctl.signal });
      if (!resp.ok) {
        const text = await resp.text();
        let parsed;
        try { parsed = text ? JSON.parse(text) : {}; } catch { parsed = text; }
        throw new ControllerError(resp.status, parsed, url);
      }
      if (raw) return await resp.arrayBuffer();
      const text = await resp.text();
      return text ? JSON.parse(text) : null;
    } finally {
      clearTimeout(timer);
    }
  }
}

/** E2B-style sandbox: `await Sandbox.create({template})` or `{pool}`. */
export class Sandbox {
  constructor(info, controller) {
    this.info = info;
    this.controller = controller;
    this.commands = {
      run: (cmd, { timeoutSecs = 60, cwd, envs } = {}) =>
        controller.execCommand(this.id, typeof cmd === "string" ? ["/bin/sh", "-c", cmd] : cmd,
          { timeoutSecs, cwd, env: envs }),
    };
    this.files = {
      write: (path, data) => controller.writeFile(this.id, path, data),
      read: async (path, { format = "text" } = {}) => {
        const bytes = await controller.readFile(this.id, path);
        return format === "bytes" ? bytes : new TextDecoder().decode(bytes);
      },
    };
  }

  get id() { return this.info.id; }
  get sandboxId() { return this.info.id; }

  static async create({ template, pool, controller, ...opts } = {}) {
    if ((template === undefined) === (pool === undefined)) {
      throw new Error("Sandbox.create needs exactly one of template (a snapshot tag) or pool");
    }
    const ctrl = controller ?? new Controller(opts);
    const [info] = pool !== undefined ? await ctrl.claim(pool, 1) : await ctrl.spawnSandboxes({ snapshotTag: template });
    return new Sandbox(info, ctrl);
  }

  static async connect(id, { controller, ...opts } = {}) {
    const ctrl = controller ?? new Controller(opts);
    return new Sandbox(await ctrl.getSandbox(id), ctrl);
  }

  eval(code, opts) { return this.controller.evalCode(this.id, code, opts); }
  runCode(code, opts = {}) { return this.controller.evalCode(this.id, code, { ...opts, mode: "exec" }); }
  ping() { return this.controller.pingSandbox(this.id); }
  branch(opts) { return this.controller.branchSandbox(this.id, opts); }
  kill() { return this.controller.killSandbox(this.id); }
  async [Symbol.asyncDispose]() { try { await this.kill(); } catch { /* already gone */ } }
}
