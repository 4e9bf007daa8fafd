// Types of the forkd SDK. The API's shapes come from ./wire.d.ts, generated from the daemon's /openapi.json
// (sdk/typescript/scripts/openapi_types.py), camelCased as the SDK maps them.
import type { Readable } from "node:stream";
import type { EgressAllow, EntryInfo, EntryList, EvalResult, ExecResult, FileWritten, Job, PathResult, PingResult,
  PortGrant, PortGrantInfo, SandboxInfo,
  SnapshotDetail, SnapshotView, Written } from "./wire.js";
export type * from "./wire.js";

/** A snapshot as /v1/snapshots answers it: every field of upstream's SnapshotInfo, and its record's. */
export type SnapshotInfo = SnapshotView;

/** How long to wait on a job, and a callback for each progress line it reports. */
export type JobWait = { timeoutMs?: number; onPhase?: (phase: string) => void };

/** What a sandbox may reach on the network: "none" (the default), "internet" (public IPv4 only), or
 * { allow: ["CIDR:port", ...] } (exactly those). */
export type Egress = "none" | "internet" | EgressAllow;

/** POST /v1/sandboxes/{id}/branch: the new snapshot, and how the branch went. */
export type BranchResult = SnapshotInfo & { mode?: "full" | "diff" | "live"; pauseMs?: number | null;
  returnedMs?: number; capture?: "pages" | "write-protect" | "stop";
  /** Why a live branch was not taken by pages (null when it was, or for full/diff). */
  captureNote?: string | null };

export class ForkdError extends Error {
  status?: number;
  body?: unknown;
  url?: string;
  hint?: string;
  /** The daemon's name for the error (problem+json `title`, e.g. "NotFound", "InvalidRequest"). */
  title?: string;
  /** The request field a validation error (422) names, e.g. "path" or "mode". */
  field?: string;
  detail: string;
}
export class InvalidInput extends ForkdError {}
export class NotFound extends ForkdError {}
export class Conflict extends ForkdError {}
export class Timeout extends ForkdError {}
export class Unavailable extends ForkdError {}
export class ProtocolViolation extends ForkdError {}
export const ControllerError: typeof ForkdError;
/** A command exited non-zero (E2B's name and getters); thrown by commands.run / CommandHandle.wait unless
 * `check: false`. */
export class CommandExitError extends ForkdError {
  readonly result: CommandResult;
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
  readonly error: string | null;
}
/** A command killed by its `timeoutSecs` (E2B's TimeoutError); `result` holds its output until then. */
export class TimeoutError extends Timeout {
  readonly result: CommandResult;
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
}

export interface ControllerOptions {
  /** TCP, e.g. http://127.0.0.1:8889 (default: $FORKD_URL, else the local unix socket, else that URL). */
  baseUrl?: string;
  /** The daemon's unix socket (default $FORKD_DAEMON_SOCKET or $FORKD_HOME/forkd.sock when it exists). */
  socketPath?: string;
  token?: string;
  /** A PEM file an https daemon's certificate is checked against (default $FORKD_CA; unset: Node's CAs). */
  ca?: string;
  timeoutMs?: number;
  /** Extra attempts after a connect error (any method) or a 503 (GET, HEAD, PUT, DELETE only). Default 3. */
  retries?: number;
}
export function findDaemon(opts?: ControllerOptions): { baseUrl?: string; socketPath?: string; token?: string };
export function toWire<T>(v: T): unknown;
export function fromWire<T>(v: unknown): T;

/** What an upload sends: a string (UTF-8), bytes, or a Node Readable / (async) iterable of chunks (read one at a
 * time, with backpressure: never held whole). */
export type UploadData = string | Uint8Array | Readable | AsyncIterable<Uint8Array | string>
  | Iterable<Uint8Array | string>;

/** One line of a watch's NDJSON stream. `type`: create, write, remove, rename, chmod, or overflow (events were
 * lost); `name` is relative to the watched directory. */
export interface WatchEvent { type: string; name: string; kind?: string | null }

export type ProcessEvent =
  | { type: "start"; pid: number | null }
  | { type: "stdout" | "stderr"; data: Uint8Array }
  | { type: "keepalive" }
  | { type: "exit"; exitCode: number; truncated: boolean; timedOut: boolean }
  | { type: "error"; title?: string; detail?: string; hint?: string };

export interface StartProcess {
  argv?: string[]; cmd?: string; env?: Record<string, string>; cwd?: string; user?: string; stdin?: boolean;
  pty?: { rows: number; cols: number }; tag?: string; maxOutput?: number; timeoutSecs?: number;
}

export class Controller {
  constructor(opts?: ControllerOptions);
  readonly baseUrl?: string;
  readonly socketPath?: string;
  readonly where: string;
  healthz(): Promise<{ ok: boolean }>;
  version(): Promise<Record<string, unknown>>;
  listSnapshots(): Promise<SnapshotInfo[]>;
  getSnapshot(tag: string): Promise<SnapshotInfo>;
  snapshotInfo(tag: string): Promise<SnapshotDetail>;
  /** Build a snapshot as a job on the daemon and wait for it (a failed build throws its error kind). */
  createSnapshot(options: { tag: string; memoryMib?: number; vcpus?: number; warmImports?: string[];
    warmRun?: string[]; warmExec?: string[]; fromTag?: string }, wait?: JobWait): Promise<SnapshotInfo>;
  deleteSnapshot(tag: string, opts?: { cascade?: boolean; force?: boolean }): Promise<void>;
  compactSnapshot(tag: string, to: string, wait?: JobWait): Promise<SnapshotInfo>;
  listJobs(): Promise<Job[]>;
  getJob(id: string, opts?: { waitSecs?: number; since?: number }): Promise<Job>;
  /** Cancel a queued or running job (a running one ends `cancelled` once its build stopped: waitJob); Conflict
   *  for a finished one. */
  cancelJob(id: string): Promise<Job>;
  /** Wait until the job is finished (Timeout after `timeoutMs`; the job keeps running). */
  waitJob(id: string, wait?: JobWait): Promise<Job>;
  spawnSandboxes(opts: { snapshotTag: string; n?: number; perChildNetns?: boolean; memoryLimitMib?: number;
    labels?: Record<string, string>; lifetimeSecs?: number; egress?: Egress }): Promise<SandboxInfo[]>;
  /** Keepalive: the sandbox now expires `timeoutSecs` from now. */
  setSandboxTimeout(id: string, timeoutSecs: number): Promise<SandboxInfo>;
  /** `n` running sandboxes continuing from this instant of `id` (a live branch; `id` keeps running). */
  forkSandbox(id: string, n?: number, opts?: { tag?: string; keep?: boolean; lifetimeSecs?: number;
    labels?: Record<string, string>; egress?: Egress }): Promise<SandboxInfo[]>;
  listSandboxes(): Promise<SandboxInfo[]>;
  /** A new authenticated path through the daemon to TCP `port` in the sandbox (its token: in this answer only). */
  openPort(id: string, port: number): Promise<PortGrant>;
  /** The sandbox's port grants, without tokens. */
  listPorts(id: string): Promise<PortGrantInfo[]>;
  /** Revoke every grant of `port` (a number), or the one grant with that id (a string). */
  closePort(id: string, port: number | string): Promise<void>;
  getSandbox(id: string): Promise<SandboxInfo>;
  killSandbox(id: string): Promise<void>;
  branchSandbox(id: string, opts?: { tag?: string; mode?: "full" | "diff" | "live"; wait?: boolean }):
    Promise<BranchResult>;
  execCommand(id: string, args: string[], opts?: { timeoutSecs?: number; cwd?: string;
    env?: Record<string, string>; stdin?: string }): Promise<ExecResult>;
  evalCode(id: string, code: string, opts?: { mode?: "eval" | "exec"; timeoutSecs?: number }): Promise<EvalResult>;
  pingSandbox(id: string): Promise<PingResult>;
  readFile(id: string, path: string): Promise<Uint8Array>;
  writeFile(id: string, path: string, data: string | Uint8Array, opts?: { mode?: number }): Promise<FileWritten>;
  /** The files routes (/v1/sandboxes/{id}/files/*), streamed both ways; `sandbox.files` wraps them. */
  listFiles(id: string, path: string, opts?: { depth?: number; maxEntries?: number }): Promise<EntryInfo[]>;
  listFilesPage(id: string, path: string,
                opts?: { depth?: number; limit?: number; cursor?: string }): Promise<EntryList>;
  statFile(id: string, path: string): Promise<EntryInfo>;
  fileExists(id: string, path: string): Promise<boolean>;
  removeFile(id: string, path: string, opts?: { recursive?: boolean }): Promise<void>;
  renameFile(id: string, src: string, dst: string): Promise<PathResult>;
  makeDir(id: string, path: string, opts?: { parents?: boolean; mode?: number }): Promise<boolean>;
  chmodFile(id: string, path: string, mode: number): Promise<PathResult>;
  downloadFile(id: string, path: string): Promise<Readable>;
  uploadFile(id: string, path: string, data: UploadData, opts?: { mode?: number; mkdir?: boolean }):
    Promise<Written>;
  watchFiles(id: string, path: string, opts?: { recursive?: boolean; timeout?: number }): Promise<Readable>;
  startProcess(id: string, opts: StartProcess): AsyncGenerator<ProcessEvent>;
  attachProcess(id: string, pid: number): AsyncGenerator<ProcessEvent>;
  listProcesses(id: string): Promise<Array<Record<string, unknown>>>;
  sendStdin(id: string, pid: number, data: string | Uint8Array, opts?: { eof?: boolean }): Promise<void>;
  killProcess(id: string, pid: number): Promise<boolean>;
  signalProcess(id: string, pid: number, signal?: string | number): Promise<boolean>;
  claim(pool: string, n?: number, opts?: { lifetimeSecs?: number }): Promise<SandboxInfo[]>;
  apply(docs: object[], opts?: { applyset?: string; prune?: boolean; manager?: string; force?: boolean }):
    Promise<Array<Record<string, unknown>>>;
  listPools(): Promise<Array<Record<string, unknown>>>;
  getPool(name: string): Promise<Record<string, unknown>>;
  deletePool(name: string): Promise<void>;
  request<T = unknown>(method: string, path: string, body?: unknown,
    opts?: { query?: Record<string, string>; raw?: boolean }): Promise<T>;
  /** The answer as a Readable once its status is known (an error status throws its kind). A streamed `body` is
   * sent as it is read and never retried. */
  open(method: string, path: string, opts?: { body?: unknown; query?: Record<string, string | number | boolean> }):
    Promise<Readable>;
  stream(method: string, path: string, body?: unknown): AsyncGenerator<ProcessEvent>;
}

export interface CommandResult {
  exitCode: number;
  stdout: string;
  stderr: string;
  stdoutBytes: Uint8Array;
  stderrBytes: Uint8Array;
  truncated: boolean;
  timedOut: boolean;
  /** Set when the stream broke before the command's exit. */
  error: string | null;
}
export interface RunOptions {
  background?: boolean;
  envs?: Record<string, string>;
  cwd?: string;
  user?: string;
  onStdout?: (text: string) => void;
  onStderr?: (text: string) => void;
  /** Kill the command after this many seconds (null: never). Default 60. */
  timeoutSecs?: number | null;
  /** Data sent then closed, or true to keep stdin open for sendStdin. */
  stdin?: string | Uint8Array | boolean;
  /** false: resolve with the result of a non-zero exit or a timeout instead of throwing CommandExitError /
   * TimeoutError. Default true, as in E2B. */
  check?: boolean;
}
export class CommandHandle {
  readonly pid: number | null;
  /** Throws CommandExitError / TimeoutError unless `check` is false. */
  wait(opts?: { check?: boolean }): Promise<CommandResult>;
  kill(): Promise<boolean>;
  signal(sig?: string | number): Promise<boolean>;
  sendStdin(data: string | Uint8Array, opts?: { eof?: boolean }): Promise<void>;
}

/** A running watch (from `files.watchDir`). */
export class WatchHandle {
  /** How the guest watches: "inotify" or "poll". */
  readonly kind: string | null;
  /** Why the stream ended early (undefined while it runs, at its timeout, or after stop()). */
  readonly error: unknown;
  /** Events dropped because getNewEvents() was not called for 10000 of them. */
  readonly dropped: number;
  /** Settles when the stream has ended. */
  readonly done: Promise<void>;
  /** The events since the last call (never waits). */
  getNewEvents(): WatchEvent[];
  /** End the watch (the daemon then stops the guest's); resolves once the stream is closed. */
  stop(): Promise<void>;
}

/** `sandbox.files`: the sandbox's filesystem, streamed through the daemon. Paths are absolute paths in the guest. */
export class Filesystem {
  constructor(sandbox: Sandbox);
  read(path: string, opts?: { format?: "text" }): Promise<string>;
  read(path: string, opts: { format: "bytes" }): Promise<Uint8Array>;
  /** A Node Readable of Buffers, read as the daemon sends them. */
  read(path: string, opts: { format: "stream" }): Promise<Readable>;
  /** Write (streamed; missing parents created unless `mkdir` is false) and return the new entry. */
  write(path: string, data: UploadData, opts?: { mode?: number; mkdir?: boolean }): Promise<EntryInfo>;
  /** The entries under a directory, `depth` levels down (default 1; symlinks are listed, not followed). */
  list(path: string, opts?: { depth?: number }): Promise<EntryInfo[]>;
  exists(path: string): Promise<boolean>;
  getInfo(path: string): Promise<EntryInfo>;
  stat(path: string): Promise<EntryInfo>;
  /** Remove a file, link or directory (with what is in it, unless `recursive` is false: then Conflict). */
  remove(path: string, opts?: { recursive?: boolean }): Promise<void>;
  rename(oldPath: string, newPath: string): Promise<EntryInfo>;
  /** Create a directory and its parents: true if made, false if it existed. */
  makeDir(path: string, opts?: { mode?: number }): Promise<boolean>;
  chmod(path: string, mode: number): Promise<void>;
  /** Resolves once the watch runs; `timeout` (seconds, default 3600) ends it. */
  watchDir(path: string, onEvent?: (ev: WatchEvent) => void | Promise<void>, opts?: { recursive?: boolean;
    timeout?: number; onExit?: (err?: unknown) => void | Promise<void> }): Promise<WatchHandle>;
}

export interface SandboxOptions extends ControllerOptions { controller?: Controller; envs?: Record<string, string> }

export class Sandbox implements AsyncDisposable {
  readonly info: SandboxInfo;
  readonly controller: Controller;
  /** Made by create (killed by `await using`), not by connect. */
  readonly owned: boolean;
  readonly envs: Record<string, string>;
  readonly id: string;
  readonly sandboxId: string;
  readonly metadata: Record<string, string>;
  commands: {
    run(cmd: string | string[], opts: RunOptions & { background: true }): Promise<CommandHandle>;
    run(cmd: string | string[], opts?: RunOptions): Promise<CommandResult>;
    list(): Promise<Array<Record<string, unknown>>>;
    kill(pid: number): Promise<boolean>;
    sendStdin(pid: number, data: string | Uint8Array, opts?: { eof?: boolean }): Promise<void>;
  };
  files: Filesystem;
  /** `timeout`: seconds it lives (default: a pool's child.ttlSeconds, else the daemon's FORKD_SANDBOX_TIMEOUT). */
  static create(opts: SandboxOptions & { template?: string; pool?: string; metadata?: Record<string, string>;
    timeout?: number; egress?: Egress; allowInternetAccess?: boolean }): Promise<Sandbox>;
  /** Keepalive: this sandbox now expires `seconds` from now. */
  setTimeout(seconds: number): Promise<SandboxInfo>;
  /** `n` sandboxes continuing from this instant (this one keeps running); each is killed when disposed. */
  fork(n?: number, opts?: { timeout?: number; keep?: boolean; tag?: string; metadata?: Record<string, string>;
    egress?: Egress }): Promise<Sandbox[]>;
  static connect(id: string, opts?: SandboxOptions): Promise<Sandbox>;
  static list(opts?: ControllerOptions & { controller?: Controller; metadata?: Record<string, string> }):
    Promise<SandboxInfo[]>;
  eval(code: string, opts?: { timeoutSecs?: number }): Promise<EvalResult>;
  runCode(code: string, opts?: { timeoutSecs?: number }): Promise<EvalResult>;
  ping(): Promise<PingResult>;
  branch(opts?: { tag?: string; mode?: "full" | "diff" | "live"; wait?: boolean }): Promise<BranchResult>;
  kill(): Promise<void>;
  /** A URL through the daemon to TCP `port` in this sandbox (its token opens that port only). */
  getUrl(port: number): Promise<string>;
  /** E2B's getHost: getUrl without its scheme. */
  getHost(port: number): Promise<string>;
  closePort(port: number): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}
