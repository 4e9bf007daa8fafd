// Runs against a real daemon: FORKD_URL, FORKD_TOKEN, FORKD_SOCKET and FORKD_TEST_SNAPSHOT are set by
// tests/test_sdk.py (real VMs).
import assert from "node:assert/strict";
import crypto from "node:crypto";
import net from "node:net";
import { Readable } from "node:stream";
import { test } from "node:test";
import { CommandExitError, CommandHandle, Conflict, Controller, ControllerError, ForkdError, InvalidInput, NotFound,
  Sandbox, Timeout, TimeoutError, Unavailable, fromWire, toWire } from "../src/index.js";

const TAG = process.env.FORKD_TEST_SNAPSHOT;
const SOCK = process.env.FORKD_SOCKET;
const skip = !process.env.FORKD_URL || !TAG ? "needs FORKD_URL and FORKD_TEST_SNAPSHOT (run via tests/test_sdk.py)" : false;

test("one casing: camelCase here, snake_case on the wire, free-form maps untouched", () => {
  assert.deepEqual(toWire({ snapshotTag: "t", env: { MY_VAR: "1" }, labels: { team_a: "x" } }),
    { snapshot_tag: "t", env: { MY_VAR: "1" }, labels: { team_a: "x" } });
  assert.deepEqual(fromWire({ exit_code: 0, timed_out: false, labels: { a_b: "c" } }),
    { exitCode: 0, timedOut: false, labels: { a_b: "c" } });
});

// The daemon's process stream as CommandHandle reads it (events of POST .../processes), for the E2B error mapping
async function* events(...evs) { for (const ev of evs) yield ev; }
const handle = (...evs) => new CommandHandle({ id: "sb-1" }, events(...evs), { pid: 7 }, { timeoutSecs: 2 });

test("E2B semantics: a non-zero exit throws CommandExitError with the result; check: false returns it", async () => {
  const exit3 = () => handle({ type: "stdout", data: Buffer.from("out\n") },
    { type: "stderr", data: Buffer.from("boom\n") }, { type: "exit", exitCode: 3 });
  await assert.rejects(exit3().wait(), (e) => e instanceof CommandExitError && e instanceof ForkdError &&
    e.exitCode === 3 && e.stdout === "out\n" && e.stderr === "boom\n" && e.error === null &&
    e.result.exitCode === 3 && /command 7 in sandbox sb-1 exited with code 3: boom/.test(e.message));
  const r = await exit3().wait({ check: false });
  assert.deepEqual([r.exitCode, r.stdout], [3, "out\n"]);
  assert.equal((await handle({ type: "exit", exitCode: 0 }).wait()).exitCode, 0);
  // a stream cut before the exit: not a success either
  await assert.rejects(handle().wait(), (e) => e instanceof CommandExitError && e.exitCode === -1 &&
    e.error === "the stream ended early");
});

test("E2B semantics: a kill by the command's timeout throws TimeoutError (a Timeout) with the partial output",
  async () => {
    const timedOut = () => handle({ type: "stdout", data: Buffer.from("partial") },
      { type: "exit", exitCode: -9, timedOut: true });
    await assert.rejects(timedOut().wait(), (e) => e instanceof TimeoutError && e instanceof Timeout &&
      !(e instanceof CommandExitError) && e.stdout === "partial" && e.exitCode === -9 && /timeout of 2 s/.test(e.message));
    assert.equal((await timedOut().wait({ check: false })).timedOut, true);
  });

test("an unreachable daemon is Unavailable after the retries", async () => {
  const srv = net.createServer().listen(0, "127.0.0.1");
  await new Promise((r) => srv.once("listening", r));
  const port = srv.address().port;
  srv.close();
  const c = new Controller({ baseUrl: `http://127.0.0.1:${port}`, retries: 1 });
  await assert.rejects(c.listSandboxes(), (e) => e instanceof Unavailable && e.status === undefined &&
    /2 attempt/.test(e.message));
});

test("token is required over TCP", { skip }, async () => {
  const anon = new Controller({ token: "" });
  assert.deepEqual(await anon.healthz(), { ok: true });
  await assert.rejects(anon.listSnapshots(), (e) => e instanceof ControllerError && e.status === 401);
});

test("controller: spawn, exec, eval, branch, spawn from the branch, kill", { skip }, async () => {
  const ctrl = new Controller();
  assert.ok((await ctrl.listSnapshots()).some((s) => s.tag === TAG && s.status === "ready"));
  const [sb] = await ctrl.spawnSandboxes({ snapshotTag: TAG, n: 1 });
  assert.equal(sb.snapshotTag, TAG);
  const made = [sb.id];
  try {
    const ex = await ctrl.execCommand(sb.id, ["sh", "-c", "echo ts > /root/ts.txt; cat /root/ts.txt"]);
    assert.equal(ex.stdout, "ts\n");
    assert.equal(ex.exitCode, 0);
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
    assert.equal(snap.branchedFrom, sb.id);
    const [g] = await ctrl.spawnSandboxes({ snapshotTag: "ts-branch" });
    made.push(g.id);
    assert.equal((await ctrl.execCommand(g.id, ["cat", "/root/ts.txt"])).stdout, "ts\n");
    await ctrl.killSandbox(g.id);
    await assert.rejects(ctrl.getSandbox(g.id), (e) => e instanceof NotFound && e.status === 404);
  } finally {
    for (const id of made) await ctrl.killSandbox(id).catch(() => {});
    await ctrl.deleteSnapshot("ts-branch").catch(() => {});
  }
});

test("Sandbox over the unix socket: streaming commands, envs, files, eval; connect never kills", { skip }, async () => {
  const sb = await Sandbox.create({ template: TAG, socketPath: SOCK, envs: { WHO: "ts" } });
  try {
    assert.equal(sb.controller.socketPath, SOCK);
    const seen = [];
    const r = await sb.commands.run("echo $WHO; echo err >&2; exit 3", { onStdout: (t) => seen.push(t),
      check: false });
    assert.deepEqual([r.stdout, r.stderr, r.exitCode, seen.join("")], ["ts\n", "err\n", 3, "ts\n"]);
    await assert.rejects(sb.commands.run("echo $WHO; exit 4"), (e) => e instanceof CommandExitError &&
      e.exitCode === 4 && e.stdout === "ts\n");
    await assert.rejects(sb.commands.run(["sleep", "30"], { timeoutSecs: 1 }), (e) => e instanceof TimeoutError);
    const h = await sb.commands.run(["sleep", "600"], { background: true });
    assert.ok(h.pid);
    assert.equal(await h.kill(), true);
    await assert.rejects(h.wait(), (e) => e instanceof CommandExitError && e.exitCode !== 0);
    await sb.files.write("/root/hello.txt", "hello from ts");
    assert.equal(await sb.files.read("/root/hello.txt"), "hello from ts");
    assert.equal((await sb.eval("WARM_GLOBAL")).result, "'set at warm-up'");
    await assert.rejects(sb.files.read("/no/such"), (e) => e instanceof NotFound);
    assert.ok((await Sandbox.list({ socketPath: SOCK })).some((s) => s.id === sb.id));
    const again = await Sandbox.connect(sb.id); // over TCP (FORKD_URL)
    assert.equal(again.owned, false);
    await again[Symbol.asyncDispose](); // what `await using` calls: must not kill a sandbox it only connected to
    assert.equal((await sb.ping()).pong, true);
  } finally {
    await sb[Symbol.asyncDispose]();
  }
  await assert.rejects(new Controller({ socketPath: SOCK }).getSandbox(sb.id), (e) => e instanceof NotFound);
});

test("lifetimes and fork(n): create({timeout}), setTimeout, fork(2) continuing from this instant", { skip }, async () => {
  const sb = await Sandbox.create({ template: TAG, timeout: 600 });
  const made = [sb];
  try {
    const left = sb.info.expiresAtUnix - Date.now() / 1000;
    assert.ok(left > 500 && left <= 601, `expires in ${left} s, asked 600`);
    await sb.setTimeout(1200);
    assert.ok(sb.info.expiresAtUnix - Date.now() / 1000 > 1100);
    assert.equal((await sb.commands.run("echo fork-mark > /root/f.txt")).exitCode, 0);
    const kids = await sb.fork(2, { timeout: 300 });
    made.push(...kids);
    assert.equal(kids.length, 2);
    assert.equal(new Set(kids.map((k) => k.id)).size, 2);
    for (const k of kids) {
      assert.ok(k.id !== sb.id && k.info.expiresAtUnix - Date.now() / 1000 <= 301);
      assert.equal((await k.commands.run("cat /root/f.txt")).stdout, "fork-mark\n");
    }
    assert.equal((await sb.ping()).pong, true); // the source keeps running
  } finally {
    for (const s of made) await s.kill().catch(() => {});
  }
});

/** n bytes that differ at every offset (a misplaced chunk shows), yielded `size` at a time: never held whole. */
function* pattern(n, size = 256 << 10) {
  for (let i = 0, k = 0; i < n; i += size, k++) {
    const block = Buffer.alloc(Math.min(size, n - i));
    for (let j = 0; j < block.length; j += 32) crypto.createHash("sha256").update(`${k}:${j}`).digest().copy(block, j);
    yield block;
  }
}
const sha256 = async (chunks) => {
  const h = crypto.createHash("sha256");
  let n = 0;
  for await (const c of chunks) { h.update(c); n += c.length; }
  return [n, h.digest("hex")];
};

test("files: a 3 MiB streamed upload and download, list/exists/getInfo/makeDir/rename/remove, errors", { skip },
  async () => {
    const sb = await Sandbox.create({ template: TAG });
    try {
      const size = 3 * (1 << 20) + 12345; // over the 1 MiB chunk, not a multiple of it
      const [n, want] = await sha256(pattern(size));
      const up = await sb.files.write("/root/fs/big.bin", Readable.from(pattern(size)));
      assert.deepEqual([up.type, up.size, up.path, up.name], ["file", size, "/root/fs/big.bin", "big.bin"]);
      const down = await sb.files.read("/root/fs/big.bin", { format: "stream" });
      assert.equal(typeof down.pipe, "function"); // a Node Readable
      assert.deepEqual(await sha256(down), [n, want]);
      const sum = await sb.commands.run("sha256sum /root/fs/big.bin");
      assert.equal(sum.stdout.split(" ")[0], want); // what the guest holds, not only what came back
      assert.equal((await sb.files.write("/root/fs/gen.bin", pattern(1000, 300), { mode: 0o600 })).mode, 0o600);
      assert.equal((await sb.files.write("/root/fs/a.txt", "hello")).size, 5);
      assert.equal(await sb.files.read("/root/fs/a.txt"), "hello");
      assert.deepEqual(await sb.files.read("/root/fs/a.txt", { format: "bytes" }), new TextEncoder().encode("hello"));
      assert.deepEqual((await sb.files.list("/root/fs")).map((e) => [e.name, e.type]),
        [["a.txt", "file"], ["big.bin", "file"], ["gen.bin", "file"]]);
      assert.equal(await sb.files.makeDir("/root/fs/sub/deep"), true);
      assert.equal(await sb.files.makeDir("/root/fs/sub/deep"), false);
      assert.deepEqual((await sb.files.list("/root/fs", { depth: 3 })).map((e) => e.path).filter((x) => x.includes("sub")),
        ["/root/fs/sub", "/root/fs/sub/deep"]);
      assert.equal((await sb.files.rename("/root/fs/a.txt", "/root/fs/sub/a.txt")).path, "/root/fs/sub/a.txt");
      assert.equal(await sb.files.exists("/root/fs/sub/a.txt"), true);
      assert.equal(await sb.files.exists("/root/fs/a.txt"), false);
      assert.equal((await sb.files.getInfo("/root/fs/sub")).type, "dir");
      await assert.rejects(sb.files.remove("/root/fs/sub", { recursive: false }), (e) => e instanceof Conflict);
      await sb.files.remove("/root/fs");
      assert.equal(await sb.files.exists("/root/fs"), false);
      await assert.rejects(sb.files.read("/root/missing.txt", { format: "stream" }), (e) => e instanceof NotFound &&
        e.status === 404 && e.title === "NotFound" && e.detail.includes("/root/missing.txt") && Boolean(e.hint));
      await assert.rejects(sb.files.getInfo("/root/missing.txt"), (e) => e instanceof NotFound);
      await assert.rejects(sb.controller.makeDir(sb.id, "relative/dir"), (e) => e instanceof InvalidInput &&
        e.status === 422 && e.field === "path");
      await assert.rejects(sb.files.write("/root/x.bin", (function* () { yield Buffer.from("x"); throw new Error("gone"); })()),
        (e) => e instanceof ControllerError && e.cause?.message === "gone");
      assert.equal(await sb.files.exists("/root/x.bin"), false); // an aborted upload leaves nothing behind
    } finally {
      await sb.kill().catch(() => {});
    }
  });

test("files: watchDir streams a directory's events to onEvent until stop()", { skip }, async () => {
  const sb = await Sandbox.create({ template: TAG });
  try {
    await sb.files.makeDir("/root/w");
    const seen = [];
    let exited = false;
    const h = await sb.files.watchDir("/root/w", (ev) => seen.push(ev), { onExit: () => { exited = true; } });
    assert.ok(["inotify", "poll"].includes(h.kind), h.kind);
    await sb.files.write("/root/w/new.txt", "x");
    await sb.commands.run("echo more >> /root/w/new.txt && rm /root/w/new.txt");
    const events = [];
    for (let i = 0; i < 300 && !events.some((e) => e.type === "remove"); i++) {
      events.push(...h.getNewEvents());
      await new Promise((r) => setTimeout(r, 200));
    }
    await h.stop();
    assert.ok(events.some((e) => e.type === "remove" && e.name === "new.txt"), JSON.stringify(events));
    assert.ok(events.some((e) => e.type === "create" && (e.name === "new.txt" || e.name.startsWith(".new.txt.forkd-"))),
      JSON.stringify(events));
    assert.deepEqual(seen.slice(0, events.length), events); // onEvent got the same ones
    assert.equal(exited, true);
    assert.equal(h.error, undefined);
    await assert.rejects(sb.files.watchDir("/root/no-such-dir"), (e) => e instanceof NotFound);
  } finally {
    await sb.kill().catch(() => {});
  }
});
