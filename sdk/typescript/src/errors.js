// The SDK's error kinds (re-exported by ./index.js): one per HTTP status family, as the Python SDK's
// forkd_client.errors. The daemon answers a failure as problem+json {title, status, detail, hint, errors?}; every
// field of it is kept on the thrown error.

/** Every failure: `status` (HTTP code; undefined when the daemon was not reached), `body`, `detail`, `hint`,
 * `title` (the daemon's name for the error, e.g. "NotFound") and `field` (the request field a 422 names). */
export class ForkdError extends Error {
  constructor(message, { status, body, url, hint, title, field } = {}) {
    super(hint ? `${message}\n  hint: ${hint}` : message);
    this.name = new.target.name;
    Object.assign(this, { status, body, url, hint, title, field, detail: message });
  }
}
export class InvalidInput extends ForkdError {}
export class NotFound extends ForkdError {}
export class Conflict extends ForkdError {}
export class Timeout extends ForkdError {}
export class Unavailable extends ForkdError {}
export class ProtocolViolation extends ForkdError {}
export const ControllerError = ForkdError; // the older name of the base class

/** A command exited with a code other than 0 (E2B's name and getters): `exitCode`, `stdout`, `stderr`, `error`,
 * and the whole `result`. Thrown by `commands.run` and `CommandHandle.wait` unless `check: false`. */
export class CommandExitError extends ForkdError {
  constructor(result, what = "command") {
    const tail = (result.stderr ?? "").slice(-500).trimEnd() || result.error || "";
    super(`${what} exited with code ${result.exitCode}${tail ? `: ${tail}` : ""}`,
      { hint: "pass check: false to get the result of a non-zero exit instead of this error" });
    this.result = result;
  }
  get exitCode() { return this.result.exitCode; }
  get error() { return this.result.error; }
  get stdout() { return this.result.stdout; }
  get stderr() { return this.result.stderr; }
}

/** A command outlived its `timeoutSecs` and was killed (E2B's TimeoutError); `result` holds its output until then.
 * A Timeout too, so `instanceof Timeout` catches it as every other timeout. */
export class TimeoutError extends Timeout {
  constructor(result, timeoutSecs, what = "command") {
    super(`${what} was killed after its timeout of ${timeoutSecs} s`,
      { hint: "pass a longer timeoutSecs (null: none), or check: false to get the partial result" });
    this.result = result;
  }
  get exitCode() { return this.result.exitCode; }
  get stdout() { return this.result.stdout; }
  get stderr() { return this.result.stderr; }
}

/** `result`, or its error when `check` and the command timed out or exited non-zero (as E2B, by default). */
export function checked(result, check, timeoutSecs, what) {
  if (check && result.timedOut) throw new TimeoutError(result, timeoutSecs, what);
  if (check && result.exitCode !== 0) throw new CommandExitError(result, what);
  return result;
}

const KINDS = { 400: InvalidInput, 401: InvalidInput, 403: InvalidInput, 404: NotFound, 408: Timeout, 409: Conflict,
  415: InvalidInput, 421: InvalidInput, 422: InvalidInput, 502: ProtocolViolation, 503: Unavailable, 504: Timeout };
const WHERE = new Set(["body", "query", "path", "header"]); // the first part of a validation error's loc

/** The request field a validation error names: `loc` without its "body"/"query" part, dotted ("path", "mode"). */
function fieldOf(body) {
  if (typeof body?.field === "string") return body.field;
  const loc = Array.isArray(body?.errors) ? body.errors[0]?.loc : undefined;
  if (!Array.isArray(loc) || !loc.length) return undefined;
  return (WHERE.has(loc[0]) && loc.length > 1 ? loc.slice(1) : loc).join(".");
}

/** The error kind of an answer with status >= 400 (its body parsed: problem+json, other JSON, or text). */
export function apiError(status, body, url) {
  let detail = body && typeof body === "object" ? body.detail ?? body.error ?? JSON.stringify(body) : String(body);
  if (Array.isArray(detail)) detail = detail.map((d) => `${(d.loc ?? []).join(".")}: ${d.msg}`).join("; ");
  const Kind = KINDS[status] ?? ForkdError;
  const title = typeof body?.title === "string" ? body.title : undefined;
  return new Kind(String(detail || `HTTP ${status}`), { status, body, url, hint: body?.hint, title, field: fieldOf(body) });
}
