// Types of the forkd SDK. The API's shapes come from ./wire.d.ts, generated from the daemon's /openapi.json
// (sdk/typescript/scripts/openapi_types.py), camelCased as the SDK maps them.
import type { EvalResult, ExecResult, FileWritten, PingResult, SandboxInfo, SnapshotDetail, SnapshotInfo }
  from "./wire.js";
export type * from "./wire.js";

/** POST /v1/sandboxes/{id}/branch: the new snapshot, and how the branch went. */
export type BranchResult = SnapshotInfo & { mode?: "full" | "diff" | "live"; pauseMs?: number | null;
  returnedMs?: number };

export class ForkdError extends Error {
  status?: number;
  body?: unknown;
  url?: string;
  hint?: string;
  detail: string;
}
export class InvalidInput extends ForkdError {}
export class NotFound extends ForkdError {}
export class Conflict extends ForkdError {}
export class Timeout extends ForkdError {}
export class Unavailable extends ForkdError {}
export class ProtocolViolation extends ForkdError {}
export const ControllerError: typeof ForkdError;

export interface ControllerOptions {
  /** TCP, e.g. http://127.0.0.1:8889 (default: $FORKD_URL, else the local unix socket, else that URL). */
  baseUrl?: string;
  /** The daemon's unix socket (default $FORKD_DAEMON_SOCKET or $FORKD_HOME/forkd.sock when it exists). */
  socketPath?: string;
  token?: string;
  timeoutMs?: number;
  /** Extra attempts after a connect error (any method) or a 503 (GET, HEAD, PUT, DELETE only). Default 3. */
  retries?: number;
}
export function findDaemon(opts?: ControllerOptions): { baseUrl?: string; socketPath?: string; token?: string };
export function toWire<T>(v: T): unknown;
export function fromWire<T>(v: unknown): T;

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
  createSnapshot(options: { tag: string; memoryMib?: number; vcpus?: number; warmImports?: string[];
    warmRun?: string[]; warmExec?: string[]; fromTag?: string }): Promise<SnapshotInfo>;
  deleteSnapshot(tag: string, opts?: { cascade?: boolean; force?: boolean }): Promise<void>;
  compactSnapshot(tag: string, to: string): Promise<SnapshotInfo>;
  spawnSandboxes(opts: { snapshotTag: string; n?: number; perChildNetns?: boolean; memoryLimitMib?: number;
    labels?: Record<string, string>; lifetimeSecs?: number }): Promise<SandboxInfo[]>;
  /** Keepalive: the sandbox now expires `timeoutSecs` from now. */
  setSandboxTimeout(id: string, timeoutSecs: number): Promise<SandboxInfo>;
  /** `n` running sandboxes continuing from this instant of `id` (a live branch; `id` keeps running). */
  forkSandbox(id: string, n?: number, opts?: { tag?: string; keep?: boolean; lifetimeSecs?: number;
    labels?: Record<string, string> }): Promise<SandboxInfo[]>;
  listSandboxes(): Promise<SandboxInfo[]>;
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
}
export class CommandHandle {
  readonly pid: number | null;
  wait(): Promise<CommandResult>;
  kill(): Promise<boolean>;
  signal(sig?: string | number): Promise<boolean>;
  sendStdin(data: string | Uint8Array, opts?: { eof?: boolean }): Promise<void>;
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
  files: {
    write(path: string, data: string | Uint8Array, opts?: { mode?: number }): Promise<FileWritten>;
    read(path: string, opts?: { format?: "text" }): Promise<string>;
    read(path: string, opts: { format: "bytes" }): Promise<Uint8Array>;
  };
  /** `timeout`: seconds it lives (default: a pool's child.ttlSeconds, else the daemon's FORKD_SANDBOX_TIMEOUT). */
  static create(opts: SandboxOptions & { template?: string; pool?: string; metadata?: Record<string, string>;
    timeout?: number }): Promise<Sandbox>;
  /** Keepalive: this sandbox now expires `seconds` from now. */
  setTimeout(seconds: number): Promise<SandboxInfo>;
  /** `n` sandboxes continuing from this instant (this one keeps running); each is killed when disposed. */
  fork(n?: number, opts?: { timeout?: number; keep?: boolean; tag?: string; metadata?: Record<string, string> }):
    Promise<Sandbox[]>;
  static connect(id: string, opts?: SandboxOptions): Promise<Sandbox>;
  static list(opts?: ControllerOptions & { controller?: Controller; metadata?: Record<string, string> }):
    Promise<SandboxInfo[]>;
  eval(code: string, opts?: { timeoutSecs?: number }): Promise<EvalResult>;
  runCode(code: string, opts?: { timeoutSecs?: number }): Promise<EvalResult>;
  ping(): Promise<PingResult>;
  branch(opts?: { tag?: string; mode?: "full" | "diff" | "live"; wait?: boolean }): Promise<BranchResult>;
  kill(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}
