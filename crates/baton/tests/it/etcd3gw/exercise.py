"""OpenStack's etcd3gw (PyPI) against an etcd-API server's JSON gateway: put/get, leases,
locks and watches. Prints one line per check, so that the output of a run against Baton can
be compared with a run against etcd 3.4; exits non-zero at the first failed check.

Usage: exercise.py HOST PORT
"""
import sys
import threading
import time

import etcd3gw


def check(name, ok, detail=""):
    print(f"{name}: {'ok' if ok else 'FAILED ' + str(detail)}", flush=True)
    if not ok:
        sys.exit(1)


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    c = etcd3gw.client(host=host, port=port, timeout=10)
    check("status has a leader", "leader" in c.status(), c.status())
    check("members", len(c.members()) == 1, c.members())

    # put / get
    check("put", c.put("/gw/a", "1") is True)
    check("get", c.get("/gw/a") == [b"1"], c.get("/gw/a"))
    c.put("/gw/b", "2")
    values = sorted(v for v, _ in c.get_prefix("/gw/"))
    check("get_prefix", values == [b"1", b"2"], values)
    check("create refuses an existing key", c.create("/gw/a", "x") is False)
    check("create makes a new key", c.create("/gw/c", "3") is True)
    check("replace", c.replace("/gw/a", "1", "one") is True)
    check("get after replace", c.get("/gw/a") == [b"one"], c.get("/gw/a"))
    check("delete", c.delete("/gw/a") is True)
    check("get after delete", c.get("/gw/a") == [], c.get("/gw/a"))
    check("delete_prefix", c.delete_prefix("/gw/") is True)
    check("get_all after delete_prefix", c.get_prefix("/gw/") == [], c.get_prefix("/gw/"))

    # leases
    lease = c.lease(ttl=30)
    check("lease granted", lease.id > 0, lease.id)
    c.put("/gw/leased", "x", lease=lease)
    check("lease ttl", 0 < lease.ttl() <= 30, lease.ttl())
    check("lease refresh", lease.refresh() == 30, lease.refresh())
    check("lease keys", lease.keys() == [b"/gw/leased"], lease.keys())
    check("lease revoke", lease.revoke() is True)
    check("leased key gone", c.get("/gw/leased") == [], c.get("/gw/leased"))

    # locks
    lock = c.lock("gw-lock", ttl=30)
    check("lock acquire", lock.acquire() is True)
    check("lock is acquired", lock.is_acquired() is True)
    other = c.lock("gw-lock", ttl=30)
    check("second acquire refused", other.acquire() is False)
    check("lock refresh", lock.refresh() == 30)
    check("lock release", lock.release() is True)
    check("second acquire after release", other.acquire() is True)
    other.release()

    # watch: events arrive on the stream while it is open
    events, cancel = c.watch_prefix("/gw/w/")
    got = []

    def collect():
        for event in events:
            got.append((event["kv"]["key"], event["kv"].get("value"), event.get("type", "PUT")))
            if len(got) == 3:
                return

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    time.sleep(0.5)
    c.put("/gw/w/1", "a")
    c.put("/gw/w/2", "b")
    c.delete("/gw/w/1")
    reader.join(10)
    cancel()
    check(
        "watch events",
        got == [(b"/gw/w/1", b"a", "PUT"), (b"/gw/w/2", b"b", "PUT"), (b"/gw/w/1", None, "DELETE")],
        got,
    )
    print("done", flush=True)


if __name__ == "__main__":
    main()
