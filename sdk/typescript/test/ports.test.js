// Runs against a daemon with a running sandbox whose port FORKD_TEST_PORT answers HTTP GET with "hello <path>":
// FORKD_URL, FORKD_TOKEN, FORKD_TEST_PORT_SANDBOX and FORKD_TEST_PORT are set by tests/test_ports_tls.py (a daemon
// serving TLS on the fake driver; NODE_EXTRA_CA_CERTS names its certificate).
import assert from "node:assert/strict";
import { test } from "node:test";
import { NotFound, Sandbox } from "../src/index.js";

const ID = process.env.FORKD_TEST_PORT_SANDBOX;
const PORT = Number(process.env.FORKD_TEST_PORT);
const skip = !process.env.FORKD_URL || !ID ? "needs FORKD_URL and FORKD_TEST_PORT_SANDBOX (run via tests/test_ports_tls.py)"
  : false;

test("ports: getUrl opens once, listPorts shows no token, closePort by grant id and by port", { skip }, async () => {
  const sb = await Sandbox.connect(ID);
  const url = await sb.getUrl(PORT);
  assert.equal(await sb.getUrl(PORT), url); // the same URL: the daemon shows a token once
  assert.equal(await sb.getHost(PORT), url.split("://")[1]);
  assert.equal(await (await fetch(url + "ts")).text(), "hello /ts");
  const token = url.replace(/\/$/, "").split("/").pop();
  const other = await sb.controller.openPort(ID, PORT);
  assert.ok(other.id && other.token && other.token !== token && other.sandboxId === ID);
  const listed = await sb.controller.listPorts(ID);
  assert.equal(listed.length, 2);
  assert.ok(listed.some((g) => g.id === other.id));
  assert.ok(listed.every((g) => g.token === undefined && g.path === `/v1/ports/${ID}/${PORT}/{token}/`));
  assert.ok(!JSON.stringify(listed).includes(token) && !JSON.stringify(listed).includes(other.token));
  await sb.controller.closePort(ID, other.id); // that grant only
  assert.equal((await fetch(`${sb.controller.baseUrl}${other.path}x`)).status, 404);
  assert.equal((await fetch(url + "x")).status, 200);
  await sb.closePort(PORT); // every grant of the port
  assert.equal((await fetch(url + "x")).status, 404);
  assert.deepEqual(await sb.controller.listPorts(ID), []);
  await assert.rejects(sb.controller.closePort(ID, PORT), (e) => e instanceof NotFound);
});
