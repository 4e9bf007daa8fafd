// `sb.files`: a sandbox's filesystem, E2B-style, streamed through the daemon's /v1/sandboxes/{id}/files/* routes
// (the Controller's listFiles ... watchFiles), as the Python SDK's forkd_client.files:
//
//   await sb.files.write("/root/a.txt", "hi")          // a string, bytes, or a Readable / (async) iterable of chunks
//   await sb.files.read("/root/a.txt")                 // "hi"; {format: "bytes"} or {format: "stream"} (a Readable)
//   await sb.files.list("/root", {depth: 2})           // [{name, path, type, size, mode, mtime, target}]
//   await sb.files.exists(p); await sb.files.getInfo(p); await sb.files.makeDir(p)
//   await sb.files.rename(a, b); await sb.files.remove(p)
//   const h = await sb.files.watchDir("/root", (ev) => console.log(ev)); ...; await h.stop();
import { StringDecoder } from "node:string_decoder";

import { ProtocolViolation } from "./errors.js";

const MAX_LINE = 64 << 10; // characters of one NDJSON line of a watch
const MAX_QUEUED = 10_000; // watch events kept for getNewEvents() (the oldest are dropped past it)

/** True for an upload body read piece by piece: a Node Readable, an async iterable or a (non-array) iterable. */
export function isChunkStream(v) {
  if (!v || typeof v !== "object" || v instanceof Uint8Array || Array.isArray(v)) return false;
  return typeof v[Symbol.asyncIterator] === "function" || typeof v[Symbol.iterator] === "function";
}

async function collect(stream) {
  const parts = [];
  for await (const c of stream) parts.push(c);
  return Buffer.concat(parts);
}

/** The parsed lines of an NDJSON answer, each bounded to MAX_LINE characters (the stream is untrusted). */
export async function* ndjson(stream, maxLine = MAX_LINE) {
  const dec = new StringDecoder("utf8");
  let buf = "";
  const parse = (line) => {
    try { return JSON.parse(line); } catch (e) { throw new ProtocolViolation(`a watch event is not JSON: ${e.message}`); }
  };
  for await (const chunk of stream) {
    buf += dec.write(chunk);
    for (let i = buf.indexOf("\n"); i >= 0; i = buf.indexOf("\n")) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      if (line.length > maxLine) throw new ProtocolViolation(`a watch event of over ${maxLine} characters`);
      if (line.trim()) yield parse(line);
    }
    if (buf.length > maxLine) throw new ProtocolViolation(`a watch event of over ${maxLine} characters`);
  }
  buf += dec.end();
  if (buf.trim()) yield parse(buf);
}

/** A running watch of a directory (from `sb.files.watchDir`): events go to `onEvent` and are kept for
 * `getNewEvents()`; `stop()` ends the stream (the daemon then stops the guest's watch). */
export class WatchHandle {
  #resp;
  #events;
  #queue = [];
  #stopped = false;

  constructor(resp, events, started, { onEvent, onExit } = {}) {
    this.#resp = resp;
    this.#events = events;
    /** "inotify" or "poll": how the guest watches. */
    this.kind = started.kind ?? null;
    /** Why the stream ended early (undefined while it runs, or when it ended at its timeout or by stop()). */
    this.error = undefined;
    /** Events dropped because getNewEvents() was not called for MAX_QUEUED of them. */
    this.dropped = 0;
    this.done = this.#run(onEvent, onExit);
  }

  /** Wait for the stream's first line ({type: "started"}) and return the running handle. */
  static async open(resp, opts) {
    const events = ndjson(resp);
    let first;
    try {
      first = await events.next();
    } catch (e) {
      resp.destroy();
      throw e;
    }
    if (first.done || first.value?.type !== "started") {
      resp.destroy();
      throw new ProtocolViolation("a watch stream did not start with a 'started' event");
    }
    return new WatchHandle(resp, events, first.value, opts);
  }

  async #run(onEvent, onExit) {
    try {
      for await (const ev of this.#events) {
        if (this.#stopped) break;
        if (ev?.type === "keepalive") continue;
        if (this.#queue.push(ev) > MAX_QUEUED) {
          this.#queue.shift();
          this.dropped++;
        }
        if (onEvent) await onEvent(ev);
      }
    } catch (err) {
      if (!this.#stopped) this.error = err;
    } finally {
      this.#resp.destroy();
    }
    if (onExit) await onExit(this.error);
  }

  /** The events since the last call (never waits). */
  getNewEvents() { return this.#queue.splice(0); }

  /** End the watch now; resolves once the stream is closed. */
  async stop() {
    this.#stopped = true;
    this.#resp.destroy();
    await this.done;
  }
}

/** The files of one sandbox (`sb.files`). Paths are absolute paths in the guest. */
export class Filesystem {
  constructor(sb) { this.sandbox = sb; }

  get #c() { return this.sandbox.controller; }
  get #id() { return this.sandbox.id; }

  /** The file's content: format "text" (UTF-8, the default), "bytes" (a Uint8Array) or "stream" (a Node Readable
   * of Buffers, read as the daemon sends it). */
  async read(path, { format = "text" } = {}) {
    if (!["text", "bytes", "stream"].includes(format)) throw new TypeError(`format: "text", "bytes" or "stream", not ${format}`);
    const resp = await this.#c.downloadFile(this.#id, path);
    if (format === "stream") return resp;
    const buf = await collect(resp);
    return format === "bytes" ? new Uint8Array(buf.buffer, buf.byteOffset, buf.length) : buf.toString("utf8");
  }

  /** Write (streamed; missing parents created unless mkdir is false) and return the new entry. */
  async write(path, data, { mode = 0o644, mkdir = true } = {}) {
    await this.#c.uploadFile(this.#id, path, data, { mode, mkdir });
    return this.#c.statFile(this.#id, path);
  }

  /** The entries under a directory, `depth` levels down (symlinks are listed, not followed). */
  list(path, { depth = 1 } = {}) { return this.#c.listFiles(this.#id, path, { depth }); }
  exists(path) { return this.#c.fileExists(this.#id, path); }
  getInfo(path) { return this.#c.statFile(this.#id, path); }
  stat(path) { return this.getInfo(path); }

  /** Remove a file, link or directory (with what is in it, unless recursive is false: then a Conflict). */
  remove(path, { recursive = true } = {}) { return this.#c.removeFile(this.#id, path, { recursive }); }

  async rename(oldPath, newPath) {
    await this.#c.renameFile(this.#id, oldPath, newPath);
    return this.#c.statFile(this.#id, newPath);
  }

  /** Create a directory and its parents: true if made, false if it existed. */
  makeDir(path, { mode = 0o755 } = {}) { return this.#c.makeDir(this.#id, path, { parents: true, mode }); }

  async chmod(path, mode) { await this.#c.chmodFile(this.#id, path, mode); }

  /** Watch a directory: resolves once the watch runs (`handle.kind`: inotify or poll). Events: {type, name} with
   * type create, write, remove, rename, chmod or overflow (events were lost); `name` is relative to `path`. */
  async watchDir(path, onEvent, { recursive = false, timeout = 3600, onExit } = {}) {
    const resp = await this.#c.watchFiles(this.#id, path, { recursive, timeout });
    return WatchHandle.open(resp, { onEvent, onExit });
  }
}
