# Drives `warrant mcp` with the official Python MCP SDK over stdio and prints one JSON summary.
# Usage: python python_sdk.py WARRANT_BIN DATA_DIR   (the key in WARRANT_KEY)
import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main(binary, data_dir):
    params = StdioServerParameters(
        command=binary, args=["mcp", "--data-dir", data_dir], env=dict(os.environ), cwd=os.getcwd()
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            tools = await session.list_tools()
            calls = await asyncio.gather(
                *[session.call_tool("lookup_order", {"order_id": "ord_7Hq2Lm9Xv3"}) for _ in range(5)]
            )
            refused = await session.call_tool("lookup_order", {"order_id": 7})
            summary = {
                "protocol": init.protocol_version,
                "tools": sorted(t.name for t in tools.tools),
                "calls": [c.structured_content for c in calls],
                "refused": refused.structured_content,
            }
            print(json.dumps(summary))


asyncio.run(main(sys.argv[1], sys.argv[2]))
