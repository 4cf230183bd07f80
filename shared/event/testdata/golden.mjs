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
const strings = ["", "a", "\"", "\\", "\u0000", "\u001f", " ", "\u007f", "\u2028", "é", "😀", "</script>", "\b\f\n\r\t\v"];
console.log(JSON.stringify({ source, generation, cases, strings: strings.map((s) => ({ s, json: JSON.stringify(s) })) }, null, 1));
