// What the node end-to-end scripts share: one relay of their own on a free loopback port, with
// its own data directory, that they can kill and restart; one line per check; a failure that
// stops the relay and exits 1; and a time limit.

import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });
}

/// `bin serve` on a free port; `label` prefixes every line; `limitMs` ends a stuck run.
export async function harness(bin, label, limitMs) {
  const data = mkdtempSync(join(tmpdir(), "crosstalk-e2e-"));
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  let relay;
  const onStop = [];
  const h = {
    base,
    fail(why) {
      console.error(`FAIL [${label}] ${why}`);
      relay?.kill("SIGKILL");
      for (const f of onStop) f();
      process.exit(1);
    },
    ok(what) {
      console.log(`ok   [${label}] ${what}`);
    },
    check(cond, what, detail) {
      if (!cond) h.fail(`${what}: ${JSON.stringify(detail)}`);
      h.ok(what);
    },
    /// Also run `f` when the run fails (close a browser).
    onFail(f) {
      onStop.push(f);
    },
    async start(extra = []) {
      relay = spawn(bin, ["serve", "--host", "127.0.0.1", "--port", String(port), "--data-dir", join(data, "store"), ...extra], {
        stdio: ["ignore", "ignore", "inherit"],
        env: { ...process.env, RUST_LOG: "warn" },
      });
      for (let i = 0; i < 200; i++) {
        try {
          if ((await fetch(`${base}/healthz`)).ok) return;
        } catch {}
        await sleep(50);
      }
      h.fail("the relay did not start");
    },
    async stop(signal) {
      const exited = new Promise((r) => relay.once("exit", r));
      relay.kill(signal);
      await exited;
    },
    async done() {
      await h.stop("SIGTERM");
      rmSync(data, { recursive: true, force: true });
      h.ok("done");
      process.exit(0);
    },
  };
  setTimeout(() => h.fail(`took longer than ${limitMs / 1000} s`), limitMs).unref();
  process.on("uncaughtException", (e) => h.fail(e.stack || String(e)));
  process.on("unhandledRejection", (e) => h.fail(e?.stack || String(e)));
  // Stopped from outside (the suite failed elsewhere): the relay goes too.
  process.on("SIGTERM", () => h.fail("stopped by SIGTERM"));
  return h;
}
