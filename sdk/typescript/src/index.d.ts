export interface SnapshotInfo {
  tag: string;
  status: "writing" | "ready" | "failed";
  dir?: string | null;
  created_at_unix: number;
  parent_tag?: string | null;
  branched_from?: string | null;
  memory_mib: number;
  memory_bytes: number;
  memory_stored_bytes: number;
  error?: string | null;
  labels: Record<string, string>;
  [extra: string]: unknown;
}
export interface SnapshotDetail extends SnapshotInfo {
  depth: number | null;
  ancestors: string[];
  dependents: string[];
  children: string[];
  logical_bytes: number;
  stored_bytes: number;
}
export interface BranchResult extends SnapshotInfo {
  mode: "full" | "diff" | "live";
  pause_ms: number | null;
  returned_ms: number;
}
export interface SandboxInfo {
  id: string;
  snapshot_tag: string;
  status: string;
  netns?: string | null;
  guest_addr?: string | null;
  created_at_unix: number;
  pid?: number | null;
  memory_limit_mib?: number | null;
  pool?: string | null;
  claimed: boolean;
  ready_ms?: number | null;
  [extra: string]: unknown;
}
export interface ExecResult { stdout: string; stderr: string; exit_code: number; timed_out?: boolean }
export interface EvalResult { result: string | null; error: { type: string; message: string; traceback?: string } | null; exit_code: number; stdout: string }
export interface PingResult { pong: boolean; [extra: string]: unknown }
export interface ControllerOptions { baseUrl?: string; token?: string; timeoutMs?: number; fetch?: typeof fetch }

export class ControllerError extends Error {
  readonly status: number;
  readonly body: unknown;
  readonly url: string;
  readonly detail: string;
}

export class Controller {
  constructor(opts?: ControllerOptions);
  readonly baseUrl: string;
  healthz(): Promise<{ ok: boolean }>;
  version(): Promise<{ version: string; api: string }>;
  listSnapshots(): Promise<SnapshotInfo[]>;
  getSnapshot(tag: string): Promise<SnapshotInfo>;
  snapshotInfo(tag: string): Promise<SnapshotDetail>;
  createSnapshot(options: { tag: string; memory_mib?: number; vcpus?: number; warm_imports?: string[]; warm_run?: string[]; from_tag?: string }): Promise<SnapshotInfo>;
  deleteSnapshot(tag: string, options?: { cascade?: boolean; force?: boolean }): Promise<void>;
  compactSnapshot(tag: string, to: string): Promise<SnapshotInfo>;
  spawnSandboxes(options: { snapshotTag: string; n?: number; perChildNetns?: boolean; memoryLimitMib?: number }): Promise<SandboxInfo[]>;
  listSandboxes(): Promise<SandboxInfo[]>;
  getSandbox(id: string): Promise<SandboxInfo>;
  killSandbox(id: string): Promise<void>;
  branchSandbox(id: string, options?: { tag?: string; mode?: "full" | "diff" | "live"; wait?: boolean; diff?: boolean }): Promise<BranchResult>;
  execCommand(id: string, args: string[], options?: { timeoutSecs?: number; cwd?: string; env?: Record<string, string> }): Promise<ExecResult>;
  evalCode(id: string, code: string, options?: { mode?: "eval" | "exec"; timeoutSecs?: number }): Promise<EvalResult>;
  pingSandbox(id: string): Promise<PingResult>;
  readFile(id: string, path: string): Promise<Uint8Array>;
  writeFile(id: string, path: string, data: string | Uint8Array): Promise<{ path: string; bytes: number }>;
  claim(pool: string, n?: number): Promise<SandboxInfo[]>;
  apply(docs: object[], options?: { applyset?: string; prune?: boolean; manager?: string; force?: boolean }): Promise<object[]>;
  listPools(): Promise<object[]>;
  getPool(name: string): Promise<object>;
  deletePool(name: string): Promise<void>;
}

export class Sandbox {
  readonly info: SandboxInfo;
  readonly controller: Controller;
  readonly id: string;
  readonly sandboxId: string;
  commands: { run(cmd: string | string[], options?: { timeoutSecs?: number; cwd?: string; envs?: Record<string, string> }): Promise<ExecResult> };
  files: { write(path: string, data: string | Uint8Array): Promise<{ path: string; bytes: number }>; read(path: string, options?: { format?: "text" | "bytes" }): Promise<string | Uint8Array> };
  static create(options: ({ template: string; pool?: undefined } | { pool: string; template?: undefined }) & ControllerOptions & { controller?: Controller }): Promise<Sandbox>;
  static connect(id: string, options?: ControllerOptions & { controller?: Controller }): Promise<Sandbox>;
  eval(code: string, options?: { timeoutSecs?: number }): Promise<EvalResult>;
  runCode(code: string, options?: { timeoutSecs?: number }): Promise<EvalResult>;
  ping(): Promise<PingResult>;
  branch(options?: { tag?: string; mode?: "full" | "diff" | "live"; wait?: boolean }): Promise<BranchResult>;
  kill(): Promise<void>;
}
