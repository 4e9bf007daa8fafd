// Runs against a daemon serving TLS with a running sandbox whose port FORKD_TEST_PORT answers HTTP GET with
// "hello <path>": FORKD_URL, FORKD_TOKEN, FORKD_CA (the daemon's certificate), FORKD_TEST_PORT_SANDBOX and
// FORKD_TEST_PORT are set by tests/test_ports_tls.py (the fake driver).
import assert from "node:assert/strict";
import fs from "node:fs";
import https from "node:https";
import { test } from "node:test";
import { Controller, InvalidInput, NotFound, Sandbox } from "../src/index.js";

const ID = process.env.FORKD_TEST_PORT_SANDBOX;
const PORT = Number(process.env.FORKD_TEST_PORT);
const skip = !process.env.FORKD_URL || !ID ? "needs FORKD_URL and FORKD_TEST_PORT_SANDBOX (run via tests/test_ports_tls.py)"
  : false;

/** GET `url` trusting FORKD_CA only: { status, text }. */
function get(url) {
  return new Promise((resolve, reject) => {
    https.get(url, { ca: fs.readFileSync(process.env.FORKD_CA) }, (res) => {
      let text = "";
      res.setEncoding("utf8").on("data", (c) => { text += c; }).on("end", () => resolve({ status: res.statusCode, text }));
    }).on("error", reject);
  });
}

test("an https daemon's CA: FORKD_CA or the ca option; one that is not a file is InvalidInput", () => {
  assert.throws(() => new Controller({ baseUrl: "https://127.0.0.1:1", ca: "/nonexistent/ca.pem" }),
    (e) => e instanceof InvalidInput && /FORKD_CA/.test(e.message));
  assert.equal(new Controller({ socketPath: "/nonexistent.sock", ca: "/nonexistent/ca.pem" }).ca, undefined);
});

test("ports: getUrl opens once, listPorts shows no token, closePort by grant id and by port", { skip }, async () => {
  const sb = await Sandbox.connect(ID); // over https, trusting FORKD_CA
  const url = await sb.getUrl(PORT);
  assert.equal(await sb.getUrl(PORT), url); // the same URL: the daemon shows a token once
  assert.equal(await sb.getHost(PORT), url.split("://")[1]);
  assert.equal((await get(url + "ts")).text, "hello /ts");
  const token = url.replace(/\/$/, "").split("/").pop();
  const other = await sb.controller.openPort(ID, PORT);
  assert.ok(other.id && other.token && other.token !== token && other.sandboxId === ID);
  const listed = await sb.controller.listPorts(ID);
  assert.equal(listed.length, 2);
  assert.ok(listed.some((g) => g.id === other.id));
  assert.ok(listed.every((g) => g.token === undefined && g.path === `/v1/ports/${ID}/${PORT}/{token}/`));
  assert.ok(!JSON.stringify(listed).includes(token) && !JSON.stringify(listed).includes(other.token));
  await sb.controller.closePort(ID, other.id); // that grant only
  assert.equal((await get(`${sb.controller.baseUrl}${other.path}x`)).status, 404);
  assert.equal((await get(url + "x")).status, 200);
  await sb.closePort(PORT); // every grant of the port
  assert.equal((await get(url + "x")).status, 404);
  assert.deepEqual(await sb.controller.listPorts(ID), []);
  await assert.rejects(sb.controller.closePort(ID, PORT), (e) => e instanceof NotFound);
});
