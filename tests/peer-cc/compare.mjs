#!/usr/bin/env node
// Compares two transcripts of session.mjs (the peer's and crosstalk's), step by step, after
// replacing every timestamp with <TIME>, and prints each difference. A difference is keyed
//   step N FIELD HASH
// (FIELD: who, tool, args, text or error; HASH: the first 8 hex digits of a SHA-256 of both
// normalized values), so an allow-list line accepts exactly that pair of texts, not whatever
// the step says later.
//
// Usage: node compare.mjs PEER.jsonl CROSSTALK.jsonl [ALLOWED.txt]
// Exit 0 when every difference is in ALLOWED.txt (lines "step N FIELD HASH", '#' starts a
// comment), 1 otherwise, 2 on bad input.
import { readFileSync, existsSync } from "node:fs";
import { createHash } from "node:crypto";

const [peerFile, ctFile, allowedFile] = process.argv.slice(2);
if (!peerFile || !ctFile) {
  console.error("usage: compare.mjs PEER.jsonl CROSSTALK.jsonl [ALLOWED.txt]");
  process.exit(2);
}

// "2026-12-06 13:37:35" (SQLite's datetime('now')) and ISO 8601 ("2026-12-06T13:37:51.734486Z").
const TIME = /\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?/g;
export const normalize = (s) => String(s).replace(TIME, "<TIME>");

function load(file) {
  const steps = new Map();
  for (const line of readFileSync(file, "utf8").split("\n")) {
    if (!line.trim()) continue;
    const d = JSON.parse(line);
    steps.set(d.step, d);
  }
  return steps;
}

const peer = load(peerFile);
const ct = load(ctFile);
const allowed = new Set();
if (allowedFile && existsSync(allowedFile)) {
  for (const raw of readFileSync(allowedFile, "utf8").split("\n")) {
    const line = raw.replace(/#.*/, "").trim().replace(/\s+/g, " ");
    if (line) allowed.add(line);
  }
}

const show = (v) => (v === undefined ? "(absent)" : typeof v === "string" ? v : JSON.stringify(v));
const indent = (s) => s.split("\n").map((l) => "    | " + l).join("\n");

let differences = 0;
let unexpected = 0;
const steps = [...new Set([...peer.keys(), ...ct.keys()])].sort((a, b) => a - b);
for (const n of steps) {
  const p = peer.get(n) ?? {};
  const c = ct.get(n) ?? {};
  for (const field of ["who", "tool", "args", "text", "error"]) {
    let pv = p[field];
    let cv = c[field];
    if (field === "error") { pv = pv === true; cv = cv === true; }
    if (field === "text") { pv = pv === undefined ? undefined : normalize(pv); cv = cv === undefined ? undefined : normalize(cv); }
    if (JSON.stringify(pv) === JSON.stringify(cv)) continue;
    differences += 1;
    const hash = createHash("sha256").update(JSON.stringify([show(pv), show(cv)])).digest("hex").slice(0, 8);
    const key = `step ${n} ${field} ${hash}`;
    const ok = allowed.has(key);
    if (!ok) unexpected += 1;
    console.log(`${ok ? "allowed" : "DIFFERS"}: ${key}  (${p.who ?? c.who} ${p.tool ?? c.tool})`);
    console.log("  peer:");
    console.log(indent(show(pv)));
    console.log("  crosstalk:");
    console.log(indent(show(cv)));
  }
}
console.log(`${differences} difference(s), ${differences - unexpected} allowed, ${unexpected} not allowed`);
process.exit(unexpected === 0 ? 0 : 1);
