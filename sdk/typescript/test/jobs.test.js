// Builds as jobs: createSnapshot / compactSnapshot submit a job and wait on it; a failed build throws its error
// kind. Runs against a daemon: FORKD_URL, FORKD_TOKEN and FORKD_TEST_SNAPSHOT are set by
// tests/test_backend_contract.py (a home on the fake VMM driver).
import assert from "node:assert/strict";
import { test } from "node:test";
import { Controller, NotFound } from "../src/index.js";

const TAG = process.env.FORKD_TEST_SNAPSHOT;
const skip = !process.env.FORKD_URL || !TAG ? "needs FORKD_URL and FORKD_TEST_SNAPSHOT" : false;

test("compactSnapshot waits on its job; the job is listed; a failed build throws its kind", { skip }, async () => {
  const ctrl = new Controller();
  const phases = [];
  const info = await ctrl.compactSnapshot(TAG, "contract-ts", { timeoutMs: 120_000, onPhase: (p) => phases.push(p) });
  try {
    assert.equal(info.tag, "contract-ts");
    assert.equal(info.status, "ready");
    const jobs = await ctrl.listJobs();
    const job = jobs.find((j) => j.target === "contract-ts");
    assert.equal(job.state, "succeeded");
    assert.equal(job.result.tag, "contract-ts");
    assert.deepEqual(await ctrl.waitJob(job.id), job);
    if (job.phase) assert.equal(phases.at(-1), job.phase);
  } finally {
    await ctrl.deleteSnapshot("contract-ts");
  }
  await assert.rejects(ctrl.compactSnapshot("no-such-snapshot", "contract-ts-never"),
    (e) => e instanceof NotFound && /no-such-snapshot/.test(e.message));
});
