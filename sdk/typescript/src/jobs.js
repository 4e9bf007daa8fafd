// Waiting on a job, the daemon's answer to a build: long polls of GET /v1/jobs/{id} until it is finished, then its
// result, or the error it failed with thrown as the kind the blocking call threw.
import { Conflict, Timeout, apiError } from "./errors.js";

const FINISHED = new Set(["succeeded", "failed", "cancelled"]);
const POLL_SECS = 30; // one long poll; the daemon answers sooner when the job changes

/** The job once finished; `onPhase` gets each new progress line; Timeout after `timeoutMs` (it keeps running). */
export async function waitJob(ctrl, id, { timeoutMs, onPhase } = {}) {
  let job = await ctrl.getJob(id);
  const deadline = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
  let said;
  for (;;) {
    if (onPhase && job.phase && job.phase !== said) onPhase((said = job.phase));
    if (FINISHED.has(job.state)) return job;
    const left = deadline === undefined ? POLL_SECS : (deadline - Date.now()) / 1000;
    if (left <= 0) {
      throw new Timeout(`job ${job.id} (${job.kind} ${job.target ?? ""}) is still ${job.state}`,
        { hint: `it keeps running on the daemon: GET /v1/jobs/${job.id}, or wait longer` });
    }
    job = await ctrl.getJob(id, { waitSecs: Math.min(POLL_SECS, Math.max(left, 0.1)), since: job.version });
  }
}

/** A submitted build's result once its job is done (a daemon older than jobs answers the result itself). */
export async function built(ctrl, submitted, wait = {}) {
  const job = await submitted;
  if (!job || typeof job !== "object" || !("state" in job && "kind" in job)) return job;
  const done = await waitJob(ctrl, job.id, wait);
  if (done.state === "succeeded") return done.result;
  if (done.state === "cancelled") throw new Conflict(`job ${done.id} was cancelled`);
  const e = done.error ?? { status: 500, detail: `job ${done.id} ${done.state}` };
  throw apiError(e.status, { detail: e.detail, hint: e.hint ?? undefined, title: e.type },
    `${ctrl.where}/v1/jobs/${done.id}`);
}
