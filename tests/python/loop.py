"""The README's agent loop with the official Python MCP SDK (2.x) in its default mode.

Usage: loop.py URL MODE [TOKEN]   (MODE: auto = 2026-07-28, no session; legacy = 2025-11-25)

An agent registers, then posts, waits and checks its inbox without ever naming itself: the
relay acts as the name it registered. A second agent's reply wakes the wait. Then the first
agent's host "restarts" (a new client, the old one never closed) and registers the same name
again: with a participant token it takes its name back at once. Any deviation raises, and
the script exits non-zero with the reason.
"""

import asyncio
import sys
import uuid

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from conversation import call


async def connect(url, mode, token, stack):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx2.AsyncClient(headers=headers, timeout=60)
    await stack.enter_async_context(http)
    # The host never closes it (as Claude Code never sends DELETE): terminate_on_close off.
    transport = streamable_http_client(url, http_client=http, terminate_on_close=False)
    client = Client(transport, mode=mode)
    await stack.enter_async_context(client)
    return client


async def main(url, mode, token, other_token):
    from contextlib import AsyncExitStack

    channel = f"loop-{mode}-{uuid.uuid4().hex[:8]}"
    me = "coder" if token else f"agent-{uuid.uuid4().hex[:6]}"
    async with AsyncExitStack() as stack:
        agent = await connect(url, mode, token, stack)
        peer = await connect(url, mode, other_token, stack)
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
            again = await connect(url, mode, token, stack)
            await call(again, "register", instance_id=me)
            post2 = await call(again, "post_message", channel=channel, body="back after a restart")
            if post2["sender"] != me:
                raise AssertionError(f"after a restart, posted as {post2['sender']}")
    print(f"python mcp sdk, mode {mode}, {'participant token' if token else 'no token'}: the loop ok on {channel}")


if __name__ == "__main__":
    url, mode = sys.argv[1], sys.argv[2]
    token = sys.argv[3] if len(sys.argv) > 3 else None
    other = sys.argv[4] if len(sys.argv) > 4 else None
    try:
        asyncio.run(asyncio.wait_for(main(url, mode, token, other), timeout=90))
    except Exception as e:
        print(f"FAILED: python mcp sdk loop, mode {mode}: {type(e).__name__}: {e!r}", file=sys.stderr)
        sys.exit(1)
