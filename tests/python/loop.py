"""The README's agent loop with the official Python MCP SDK (2.x) in its default mode.

Usage: loop.py URL MODE [TOKEN OTHER_TOKEN] [--bridge CROSSTALK]
  MODE: auto = 2026-07-28, no session; legacy = 2025-11-25
  --bridge: each agent spawns `CROSSTALK mcp --relay <URL's relay> [--token TOKEN]` and talks
            to it over stdio, as a host spawns the bridge; a restart is a new bridge process

An agent registers, then posts, waits and checks its inbox without ever naming itself: the
relay acts as the name it registered. A second agent's reply wakes the wait. Then the first
agent's host "restarts" (a new client, the old one never closed) and registers the same name
again: with a participant token it takes its name back at once. Any deviation raises, and
the script exits non-zero with the reason.
"""

import asyncio
import os
import sys
import uuid

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from conversation import EXPECTED_VERSION, call


async def connect(url, mode, token, stack, bridge=None):
    if bridge:
        args = ["mcp", "--relay", url.removesuffix("/mcp")] + (["--token", token] if token else [])
        # The host's environment must not name another relay or token.
        env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSTALK_")}
        client = Client(StdioServerParameters(command=bridge, args=args, env=env), mode=mode)
        await stack.enter_async_context(client)
        return negotiated(client, mode)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx2.AsyncClient(headers=headers, timeout=60)
    await stack.enter_async_context(http)
    # The host never closes it (as Claude Code never sends DELETE): terminate_on_close off.
    transport = streamable_http_client(url, http_client=http, terminate_on_close=False)
    client = Client(transport, mode=mode)
    await stack.enter_async_context(client)
    return negotiated(client, mode)


def negotiated(client, mode):
    if client.protocol_version != EXPECTED_VERSION[mode]:
        raise AssertionError(f"mode {mode}: negotiated {client.protocol_version}")
    return client


async def main(url, mode, token, other_token, bridge):
    from contextlib import AsyncExitStack

    channel = f"loop-{mode}-{uuid.uuid4().hex[:8]}"
    me = "coder" if token else f"agent-{uuid.uuid4().hex[:6]}"
    async with AsyncExitStack() as stack:
        agent = await connect(url, mode, token, stack, bridge)
        peer = await connect(url, mode, other_token, stack, bridge)
        reg = await call(agent, "register", instance_id=me)
        if me not in reg["next"]:
            raise AssertionError(f"register does not say what to send: {reg}")
        posted = await call(agent, "post_message", channel=channel, body="ready for review?")
        if posted["sender"] != me:
            raise AssertionError(f"posted as {posted['sender']}, not {me}")

        async def wait():
            return await call(agent, "wait_for_message", channel=channel, since_id=posted["id"], timeout_s=30)

        waiting = asyncio.create_task(wait())
        await asyncio.sleep(0.5)
        await call(peer, "post_message", channel=channel, sender="reviewer", body="yes, go", reply_to=posted["id"])
        got = await waiting
        if [m["body"] for m in got["messages"]] != ["yes, go"]:
            raise AssertionError(f"the wait saw {got}")
        inbox = await call(agent, "check_messages")
        if inbox.get("instance_id", me) != me:
            raise AssertionError(f"check_messages read as {inbox}")
        # Its own messages never wake it: a wait from the reply's id times out.
        quiet = await call(agent, "wait_for_message", channel=channel, since_id=got["next_since_id"], timeout_s=0.5)
        if quiet["messages"]:
            raise AssertionError(f"woken by {quiet['messages']}")

        # The host restarts: a new client of the same token takes the name back at once.
        if token:
            again = await connect(url, mode, token, stack, bridge)
            await call(again, "register", instance_id=me)
            post2 = await call(again, "post_message", channel=channel, body="back after a restart")
            if post2["sender"] != me:
                raise AssertionError(f"after a restart, posted as {post2['sender']}")
    via = " through crosstalk mcp" if bridge else ""
    print(f"python mcp sdk, mode {mode}{via}, {'participant token' if token else 'no token'}: the loop ok on {channel}")


if __name__ == "__main__":
    argv = sys.argv[1:]
    bridge = None
    if "--bridge" in argv:
        i = argv.index("--bridge")
        bridge = argv[i + 1]
        del argv[i : i + 2]
    url, mode = argv[0], argv[1]
    token = argv[2] if len(argv) > 2 else None
    other = argv[3] if len(argv) > 3 else None
    try:
        asyncio.run(asyncio.wait_for(main(url, mode, token, other, bridge), timeout=90))
    except Exception as e:
        print(f"FAILED: python mcp sdk loop, mode {mode}: {type(e).__name__}: {e!r}", file=sys.stderr)
        sys.exit(1)
