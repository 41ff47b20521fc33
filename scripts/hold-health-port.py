#!/usr/bin/env python3
# Issue 21 item 3, live: hold a plain-HTTP health port with partial request heads (each re-opened
# when the server cuts it) and probe /healthz with a 1 s timeout, once a second, as a kubelet does.
# usage: scripts/hold-health-port.py PORT [HOLDERS=400] [PROBES=8]  (docs/security.md)
import asyncio, sys, time
PORT = int(sys.argv[1]); HOLDERS = int(sys.argv[2]) if len(sys.argv) > 2 else 400
PROBES = int(sys.argv[3]) if len(sys.argv) > 3 else 8
opened = 0
async def holder(stop):
    global opened
    while not stop.is_set():
        try:
            r, w = await asyncio.open_connection("127.0.0.1", PORT)
            w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n"); await w.drain(); opened += 1
            while await r.read(1024):
                pass
            w.close()
        except Exception:
            await asyncio.sleep(0.02)
async def probe():
    t = time.monotonic()
    try:
        async def go():
            r, w = await asyncio.open_connection("127.0.0.1", PORT)
            w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); await w.drain()
            return (await r.read()).startswith(b"HTTP/1.1 200")
        ok = await asyncio.wait_for(go(), 1.0)
    except Exception:
        ok = False
    return ok, time.monotonic() - t
async def main():
    stop = asyncio.Event()
    tasks = [asyncio.create_task(holder(stop)) for _ in range(HOLDERS)]
    await asyncio.sleep(1.0)
    res = []
    for _ in range(PROBES):
        res.append(await probe()); await asyncio.sleep(1.0)
    stop.set()
    for t in tasks: t.cancel()
    ok = sum(1 for a, _ in res if a)
    print(f"{HOLDERS} holders ({opened} heads opened): {ok} of {PROBES} probes answered within 1 s; "
          f"latencies {[round(l*1000,1) for _, l in res]} ms")
asyncio.run(main())
