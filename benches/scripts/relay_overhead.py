#!/usr/bin/env python3
# usage: benches/scripts/relay_overhead.py RELEASE_BIN_DIR [JOBS]   (root: it builds a namespace testbed)
# Sequential /bin/true jobs on a 2-node namespace testbed, from node 1's namespace, as user
# nobody: through the node's control relay, and straight to the MM's Unix socket, alternated;
# beside the fork/exec of /bin/true measured the same way. Release binaries of this commit.
import os, subprocess, sys, time, statistics
B = sys.argv[1]; d = "/tmp/relaybench"; N = int(sys.argv[2]) if len(sys.argv) > 2 else 100
subprocess.run(["rm", "-rf", d])
subprocess.run([f"{B}/storm-testbed", "--name", "rb", "--dir", d, "up", "--nodes", "2"], check=True,
               env={**os.environ, "STORM_BIN_DIR": B}, stdout=subprocess.DEVNULL)
pre = ["ip", "netns", "exec", "rb-n1", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
relay = pre + [f"{B}/storm-submit", "--socket", f"{d}/relay/node1.sock", "-N", "2", "/bin/true"]
direct = pre + [f"{B}/storm-submit", "--socket", f"{d}/mm.sock", "-N", "2", "/bin/true"]
floor = pre + ["/bin/true"]
def once(cmd):
    t = time.perf_counter(); r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if r.returncode: raise SystemExit(f"{cmd}: {r.stderr.decode()}")
    return (time.perf_counter() - t) * 1e3
res = {"relay": [], "direct": [], "floor": []}
try:
    for _ in range(5): once(relay); once(direct)
    for i in range(N):
        res["relay"].append(once(relay)); res["direct"].append(once(direct)); res["floor"].append(once(floor))
finally:
    subprocess.run([f"{B}/storm-testbed", "--name", "rb", "--dir", d, "down"], stdout=subprocess.DEVNULL)
m = {k: statistics.median(v) for k, v in res.items()}
p90 = {k: sorted(v)[int(0.9 * len(v))] for k, v in res.items()}
for k in res: print(f"{k:7} p50 {m[k]:7.2f} ms  p90 {p90[k]:7.2f} ms  p50/floor {m[k]/m['floor']:5.1f}")
print(f"relay/direct p50 {m['relay']/m['direct']:.2f}; relay adds {m['relay']-m['direct']:.2f} ms")
