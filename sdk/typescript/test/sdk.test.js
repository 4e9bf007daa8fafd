// Runs against a real daemon: FORKD_URL, FORKD_TOKEN and FORKD_TEST_SNAPSHOT are set by tests/test_sdk.py.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Controller, ControllerError, Sandbox } from "../src/index.js";

const TAG = process.env.FORKD_TEST_SNAPSHOT;
const skip = !process.env.FORKD_URL || !TAG ? "needs FORKD_URL and FORKD_TEST_SNAPSHOT (run via tests/test_sdk.py)" : false;

test("token is required over TCP", { skip }, async () => {
  const anon = new Controller({ token: "" });
  assert.deepEqual(await anon.healthz(), { ok: true });
  await assert.rejects(anon.listSnapshots(), (e) => e instanceof ControllerError && e.status === 401);
});

test("controller: spawn, exec, eval, branch, spawn from the branch, kill", { skip }, async () => {
  const ctrl = new Controller();
  assert.ok((await ctrl.listSnapshots()).some((s) => s.tag === TAG && s.status === "ready"));
  const [sb] = await ctrl.spawnSandboxes({ snapshotTag: TAG, n: 1 });
  const made = [sb.id];
  try {
    const ex = await ctrl.execCommand(sb.id, ["sh", "-c", "echo ts > /root/ts.txt; cat /root/ts.txt"]);
    assert.equal(ex.stdout, "ts\n");
    assert.equal(ex.exit_code, 0);
    assert.equal((await ctrl.evalCode(sb.id, "6 * 7")).result, "42");
    assert.equal((await ctrl.pingSandbox(sb.id)).pong, true);
    const br = await ctrl.branchSandbox(sb.id, { tag: "ts-branch", mode: "live", wait: false });
    assert.equal(br.status, "writing");
    let snap = br;
    for (let i = 0; i < 600 && snap.status === "writing"; i++) {
      await new Promise((r) => setTimeout(r, 200));
      snap = await ctrl.getSnapshot("ts-branch");
    }
    assert.equal(snap.status, "ready");
    assert.equal(snap.branched_from, sb.id);
    const [g] = await ctrl.spawnSandboxes({ snapshotTag: "ts-branch" });
    made.push(g.id);
    assert.equal((await ctrl.execCommand(g.id, ["cat", "/root/ts.txt"])).stdout, "ts\n");
    await ctrl.killSandbox(g.id);
    await assert.rejects(ctrl.getSandbox(g.id), (e) => e.status === 404 && e.body.status === 404);
  } finally {
    for (const id of made) await ctrl.killSandbox(id).catch(() => {});
    await ctrl.deleteSnapshot("ts-branch").catch(() => {});
  }
});

test("Sandbox: commands, files, eval, kill", { skip }, async () => {
  const sb = await Sandbox.create({ template: TAG });
  try {
    const r = await sb.commands.run("echo $((2+3))");
    assert.equal(r.stdout, "5\n");
    await sb.files.write("/root/hello.txt", "hello from ts");
    assert.equal(await sb.files.read("/root/hello.txt"), "hello from ts");
    assert.equal((await sb.eval("WARM_GLOBAL")).result, "'set at warm-up'");
    await assert.rejects(sb.files.read("/no/such"), (e) => e.status === 404);
  } finally {
    await sb.kill();
  }
});
