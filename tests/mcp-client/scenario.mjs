// The scenario of tests/mcp_test.go from a client vmfork did not write:
// the TypeScript SDK's, over stdio. VMFORK_MCP_COMMAND is a JSON array:
// the vmfork binary and its arguments (`... mcp --source src ...`).
// Exits non-zero, saying what failed, on the first surprise.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [command, ...args] = JSON.parse(process.env.VMFORK_MCP_COMMAND);
const transport = new StdioClientTransport({ command, args, stderr: "inherit" });
const client = new Client({ name: "vmfork-ts-scenario", version: "1.0.0" });
await client.connect(transport);

function fail(msg) {
  console.error("FAIL: " + msg);
  process.exit(1);
}

const progress = [];
async function call(name, args, { refusedBy } = {}) {
  const res = await client.callTool({ name, arguments: args }, undefined, {
    timeout: 300000,
    onprogress: (p) => progress.push(p.message),
  });
  const text = res.content.map((c) => c.text ?? "").join("");
  if (refusedBy) {
    if (!res.isError || !text.includes(`limit ${refusedBy}:`)) fail(`${name}: want a refusal naming ${refusedBy}, got ${text}`);
    console.log(`${name}: refused (${text})`);
    return null;
  }
  if (res.isError) fail(`${name} ${JSON.stringify(args)}: ${text}`);
  return res.structuredContent ?? JSON.parse(text);
}

const { tools } = await client.listTools();
const names = tools.map((t) => t.name);
for (const want of ["fork", "exec", "read_file", "write_file", "explore", "checkpoint", "rewind", "ls", "tree", "rm"]) {
  if (!names.includes(want)) fail(`tools/list has no ${want}: ${names}`);
}
console.log(`tools: ${names.join(" ")}`);

await call("fork", { source: "nowhere" }, { refusedBy: "source" });
await call("fork", { source: "src", count: 9 }, { refusedBy: "max-children" });

const fork = await call("fork", { source: "src", count: 3 });
const kids = fork.children.map((c) => c.name);
if (kids.length !== 3) fail(`fork: ${JSON.stringify(fork)}`);
if (progress.length < 4) fail(`fork: progress ${JSON.stringify(progress)}`);
console.log(`forked ${kids} (pause ${fork.pause_ms} ms); progress: ${progress.join("; ")}`);
for (const k of kids) {
  const r = await call("exec", { machine: k, command: ["hostname"] });
  if (r.exit_code !== 0 || !r.stdout_tail.trim()) fail(`exec in ${k}: ${JSON.stringify(r)}`);
}
await call("fork", { source: "src" }, { refusedBy: "max-machines" });

const cp = await call("checkpoint", { machine: kids[0] });
await call("write_file", { machine: kids[0], path: "/tmp/marker", content: "x" });
await call("rewind", { machine: kids[0], to: cp.checkpoint });
const gone = await client.callTool({ name: "read_file", arguments: { machine: kids[0], path: "/tmp/marker" } }, undefined, { timeout: 120000 });
if (!gone.isError) fail("read_file after the rewind: the file is still there");

await call("rm", { names: kids.slice(1) });
const ex = await call("explore", { source: "src", tries: ["exit 3", "true"] });
if (ex.result.winner_try !== 2) fail(`explore: want try 2 to win, got ${JSON.stringify(ex.result)}`);
console.log(`explore: winner ${ex.result.winner}, removed ${ex.result.removed}`);

await call("rm", { names: [kids[0], ex.result.winner] });
const ls = await call("ls", {});
if (ls.machines.length !== 1 || !ls.machines[0].source) fail(`ls after rm: ${JSON.stringify(ls.machines)}`);
await client.close();
console.log("ok");
