"""Two agents hold a conversation through crosstalk with the official Python MCP SDK (2.x).

Usage: conversation.py URL MODE [--bridge CROSSTALK]
  MODE: auto = server/discover first (2026-07-28), legacy = initialize (2025-11-25)
  --bridge: each agent spawns `CROSSTALK mcp --relay <URL's relay>` and talks to it over stdio,
            as a host spawns the bridge

alice asks, bob's answer wakes alice's pending wait_for_message, alice reads the channel by
since_id, both post `done` and each waits until it has seen the other's. Any deviation raises,
and the script exits non-zero with the reason.
"""

import asyncio
import sys
import time
import uuid

from mcp import Client, StdioServerParameters

EXPECTED_VERSION = {"auto": "2026-07-28", "legacy": "2025-11-25"}
WAIT_S = 20


def structured(result, tool):
    if result.is_error:
        raise AssertionError(f"{tool} failed: {result.content}")
    if not result.content or not result.content[0].text:
        raise AssertionError(f"{tool} returned no text form")
    if result.structured_content is None:
        raise AssertionError(f"{tool} returned no structured content")
    return result.structured_content


async def call(client, tool, **args):
    return structured(await client.call_tool(tool, args), tool)


async def connect(url, mode, bridge=None):
    server = url
    if bridge:
        relay = url.removesuffix("/mcp")
        server = StdioServerParameters(command=bridge, args=["mcp", "--relay", relay])
    client = Client(server, mode=mode)
    await client.__aenter__()
    if client.protocol_version != EXPECTED_VERSION[mode]:
        raise AssertionError(f"mode {mode}: negotiated {client.protocol_version}")
    return client


async def main(url, mode, bridge=None):
    channel = f"py-{mode}-{uuid.uuid4().hex[:8]}"
    alice = await connect(url, mode, bridge)
    bob = await connect(url, mode, bridge)
    try:
        tools = {t.name for t in (await alice.list_tools()).tools}
        want = {"post_message", "get_messages", "wait_for_message", "list_channels"}
        if not want <= tools:
            raise AssertionError(f"missing tools: {want - tools}")

        q = await call(alice, "post_message", channel=channel, sender="alice", type="question", body="ready?")
        q_id = q["id"]

        # bob catches up: the question is already there, so his wait returns at once.
        seen = await call(bob, "wait_for_message", channel=channel, since_id=0, timeout_s=WAIT_S)
        if [m["id"] for m in seen["messages"]] != [q_id]:
            raise AssertionError(f"bob saw {seen}")

        # alice waits for the answer; bob answers while she is waiting.
        async def alice_waits():
            started = time.monotonic()
            got = await call(alice, "wait_for_message", channel=channel, since_id=q_id, timeout_s=WAIT_S)
            return got, time.monotonic() - started

        waiting = asyncio.create_task(alice_waits())
        await asyncio.sleep(0.5)
        answer = await call(bob, "post_message", channel=channel, sender="bob", type="answer", body="yes", reply_to=q_id)
        got, waited = await waiting
        if got["timed_out"] or [m["id"] for m in got["messages"]] != [answer["id"]]:
            raise AssertionError(f"alice's wait returned {got}")
        if not 0.4 <= waited < 10:
            raise AssertionError(f"alice's wait took {waited:.2f}s: it did not wake on bob's answer")
        if got["messages"][0]["reply_to"] != q_id:
            raise AssertionError("the answer lost its reply_to")

        # Reading by since_id returns exactly what follows.
        everything = await call(alice, "get_messages", channel=channel, since_id=0)
        if [m["id"] for m in everything["messages"]] != [q_id, answer["id"]]:
            raise AssertionError(f"get_messages since 0: {everything}")
        after_q = await call(alice, "get_messages", channel=channel, since_id=q_id)
        if [m["id"] for m in after_q["messages"]] != [answer["id"]]:
            raise AssertionError(f"get_messages since {q_id}: {after_q}")

        # Both finish; each waits until it has seen the other's done.
        last = answer["id"]
        for me, other, client in (("alice", "bob", alice), ("bob", "alice", bob)):
            await call(client, "post_message", channel=channel, sender=me, type="done", body=f"{me} finished")
        for me, other, client in (("alice", "bob", alice), ("bob", "alice", bob)):
            since, done = last, False
            while not done:
                page = await call(client, "wait_for_message", channel=channel, since_id=since, timeout_s=WAIT_S)
                if page["timed_out"]:
                    raise AssertionError(f"{me} never saw {other}'s done")
                done = any(m["type"] == "done" and m["sender"] == other for m in page["messages"])
                since = page["next_since_id"]

        # A bad call is a tool error the model can read, not an exception.
        bad = await alice.call_tool("get_messages", {"channel": channel, "limit": 0})
        if not bad.is_error or "limit" not in bad.content[0].text:
            raise AssertionError(f"bad arguments: {bad}")
    finally:
        await bob.__aexit__(None, None, None)
        await alice.__aexit__(None, None, None)
    via = " through crosstalk mcp" if bridge else ""
    print(f"python mcp sdk, mode {mode} ({EXPECTED_VERSION[mode]}){via}: conversation ok on {channel}")


if __name__ == "__main__":
    url, mode = sys.argv[1], sys.argv[2]
    bridge = sys.argv[4] if sys.argv[3:4] == ["--bridge"] else None
    try:
        asyncio.run(asyncio.wait_for(main(url, mode, bridge), timeout=90))
    except BaseException as e:  # noqa: BLE001 - any failure must fail the run loudly
        print(f"FAILED: python mcp sdk conversation, mode {mode}: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
