// Drives `warrant mcp` with the official TypeScript MCP SDK over stdio and prints one JSON
// summary. Usage: node typescript_sdk.mjs WARRANT_BIN DATA_DIR (the key in WARRANT_KEY;
// NODE_PATH names the node_modules that hold @modelcontextprotocol/sdk).
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.join(process.env.NODE_PATH, 'noop.js'));
const { Client } = require('@modelcontextprotocol/sdk/client/index.js');
const { StdioClientTransport } = require('@modelcontextprotocol/sdk/client/stdio.js');

const [binary, dataDir] = process.argv.slice(2);
const transport = new StdioClientTransport({
  command: binary,
  args: ['mcp', '--data-dir', dataDir],
  env: { ...process.env },
  cwd: process.cwd(),
});
// The client hands the negotiated version to a transport that takes one (HTTP's do).
let protocol = null;
transport.setProtocolVersion = (version) => {
  protocol = version;
};
const client = new Client({ name: 'warrant-test', version: '1' });
await client.connect(transport);
const tools = await client.listTools();
const calls = await Promise.all(
  [1, 2, 3, 4, 5].map(() => client.callTool({ name: 'lookup_order', arguments: { order_id: 'ord_7Hq2Lm9Xv3' } })),
);
const refused = await client.callTool({ name: 'lookup_order', arguments: { order_id: 7 } });
console.log(JSON.stringify({
  protocol,
  tools: tools.tools.map((t) => t.name).sort(),
  calls: calls.map((c) => c.structuredContent),
  refused: refused.structuredContent,
}));
await client.close();
