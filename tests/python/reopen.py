"""One HTTP connection, two MCP sessions in turn, with the official Python MCP SDK (2.x).

Usage: reopen.py URL

A legacy (2025-11-25) client opens a session, calls a tool and closes it (the SDK sends
DELETE); a second session then opens on the same pooled connection and calls a tool. A
204 that carried a stray chunked body (`0\\r\\n\\r\\n`) made the next request on that
connection fail with "illegal status line". The pool holds two connections (a session's GET
stream takes one), so each next session's requests reuse the connection its DELETE went on.
"""

import asyncio
import sys

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


async def session(url, http, n):
    async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
        result = await client.call_tool("list_channels", {})
        if result.is_error:
            raise AssertionError(f"session {n}: list_channels failed: {result.content}")


async def main(url):
    limits = httpx2.Limits(max_connections=2, max_keepalive_connections=2)
    async with httpx2.AsyncClient(limits=limits, timeout=20) as http:
        for n in range(3):
            await session(url, http, n)
    print("python mcp sdk: three sessions opened and closed on one connection")


if __name__ == "__main__":
    try:
        asyncio.run(asyncio.wait_for(main(sys.argv[1]), timeout=60))
    except Exception as e:
        print(f"FAILED: python mcp sdk, sessions reopened on one connection: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
