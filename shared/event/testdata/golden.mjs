// Regenerates golden.json with Node.js, the SDK's runtime, so the Go tests
// compare against what the SDK itself computes: `node golden.mjs > golden.json`.
import { createHash } from "node:crypto";

const replicationEventId = (source, history, generation) =>
  createHash("sha256").update(`${source}:${history}:${generation}`).digest("hex");
const publishMessage = (event) => ({ data: Buffer.from(JSON.stringify(event)).toString("base64") });

const source = "6f1c2a52-8b0e-4d7a-9a51-3c2b1d0e9f84";
const generation = "0d9e8c7b-6a5f-4e3d-8c2b-1a0f9e8d7c6b";
const payloads = [
  { id: "a1", name: "plain" },
  { id: "a2", note: "quotes \" and backslash \\ and <html> & amp" },
  { id: "a3", note: "controls \u0000\u0001\b\t\n\u000b\f\r\u001f\u007f" },
  { id: "a4", note: "unicode é ü 漢字 😀 \u2028 \u2029" },
  { id: "a5", note: "x".repeat(5000) },
];
const cases = payloads.map((payload, i) => {
  const history = `00000000-0000-4000-8000-00000000000${i}`;
  const event = {
    event_id: replicationEventId(source, history, generation),
    source_id: source,
    generation,
    entity_id: "entity-" + i,
    record_key: payload.id,
    record_kind: i % 2 ? "entity" : "edge:owner",
    revision: String(1000 + i),
    deleted: i % 3 === 0,
    schema_hash: "hash-" + i,
    payload: JSON.stringify(payload),
  };
  return {
    history,
    event,
    json: JSON.stringify(event),
    message_bytes: Buffer.byteLength(JSON.stringify(publishMessage(event))) + 1,
  };
});
// Captured events as PostgreSQL's jsonb text (SELECT …::jsonb::text on
// PostgreSQL 15): what the SDK's client parses. The message is built exactly
// as pendingReplicationEvents (seed 000) builds it.
const captured = [
 "{\"deleted\": false, \"payload\": \"{\\\"id\\\": \\\"x\\\", \\\"title\\\": \\\"quotes \\\\\\\" \\\\\\\\ and <html> & tab\\\\tnl\\\\n ctl \\\\u0001 é 漢字 😀  \\\"}\", \"revision\": \"42\", \"entity_id\": \"e-product\", \"source_id\": \"6f1c2a52-8b0e-4d7a-9a51-3c2b1d0e9f84\", \"generation\": \"11111111-1111-4111-8111-111111111111\", \"record_key\": \"00000000-0000-4000-8000-0000000000aa\", \"record_kind\": \"entity\", \"schema_hash\": \"h1\"}",
 "{\"deleted\": true, \"payload\": \"{}\", \"revision\": \"7\", \"entity_id\": \"e\", \"source_id\": \"s\", \"record_key\": \"k\", \"record_kind\": \"entity\", \"schema_hash\": \"h\"}",
 "{\"deleted\": false, \"payload\": \"{\\\"source_id\\\": \\\"a\\\", \\\"target_id\\\": null}\", \"revision\": \"9\", \"entity_id\": \"e-order\", \"source_id\": \"s\", \"generation\": \"g-old\", \"record_key\": null, \"record_kind\": \"edge:products\", \"schema_hash\": \"h\"}",
 "{\"7\": \"index key\", \"extra\": \"kept\", \"deleted\": \"no\", \"payload\": {\"n\": 1.50, \"arr\": [1, 2.0, \"x\", {\"2\": 4, \"a\": 2, \"b\": 1, \"10\": 3}], \"big\": 1000000000000000000000, \"neg\": 0, \"small\": 0.0000001}, \"event_id\": \"forged\", \"revision\": 12, \"entity_id\": \"e\", \"source_id\": \"s\", \"record_key\": \"k\", \"record_kind\": \"entity\", \"schema_hash\": null}",
 // Captured events missing keys the table requires: the SDK publishes them
 // as they are, and the BigQuery subscription judges them (they are
 // dead-lettered); so does the drain.
 "{\"deleted\": false, \"payload\": \"{}\", \"revision\": \"5\", \"source_id\": \"s\", \"record_key\": \"k\"}",
 "{\"note\": \"written past the capture trigger\"}",
 "{}"
];
const messages = captured.map((raw, i) => {
  const history = `00000000-0000-4000-8000-1000000000${String(i).padStart(2, "0")}`;
  const payload = JSON.parse(raw);
  const event = { ...payload, generation, event_id: replicationEventId(source, history, generation) };
  return { history, raw, message: JSON.stringify(event), message_bytes: Buffer.byteLength(JSON.stringify(publishMessage(event))) + 1 };
});
const strings = ["", "a", "\"", "\\", "\u0000", "\u001f", " ", "\u007f", "\u2028", "é", "😀", "</script>", "\b\f\n\r\t\v"];
console.log(JSON.stringify({ source, generation, cases, captured: messages, strings: strings.map((s) => ({ s, json: JSON.stringify(s) })) }, null, 1));
