#!/usr/bin/env python3
"""Checks, with plain QEMUs and no guest (q35, 128 MiB, TCG: the BIOS runs),
the chain that fork --to's live path needs (docs/TEMPLATES.md, "The live
path, designed"):

  P  a source, frozen as vmfork freezes one: stop, x-ignore-shared, device
     state saved to a file, its shared RAM file copied (the template);
  L  a QEMU loaded from that template as a child is (RAM share=off,
     -incoming defer, x-ignore-shared): it stays paused;
  C  the child on "the other host": RAM of its own (share=on tmpfs file),
     -incoming defer, postcopy-ram;
  L's x-ignore-shared off and postcopy-ram on, L migrates to C over a unix
  socket and switches to postcopy at once; C runs before its RAM is there.

With --kill, L (the far end of the link) is killed while C is in
postcopy-active, and C's state is printed: QEMU 7.2 leaves it
postcopy-paused. Needs root (or vm.unprivileged_userfaultfd=1).

    sudo scripts/postcopy-from-template.py [--kill]
"""
import json, os, shutil, socket, subprocess, sys, tempfile, time

D = tempfile.mkdtemp(prefix="vmfork-postcopy-")
SHM = tempfile.mkdtemp(prefix="vmfork-postcopy-", dir="/dev/shm")


def qmp(path):
    s = socket.socket(socket.AF_UNIX)
    for _ in range(200):
        try:
            s.connect(path)
            break
        except OSError:
            time.sleep(0.05)
    f = s.makefile("rw")
    f.readline()

    def cmd(c, **a):
        f.write(json.dumps({"execute": c, "arguments": a}) + "\n")
        f.flush()
        while True:
            r = json.loads(f.readline())
            if "event" not in r:
                return r
    cmd("qmp_capabilities")
    return cmd


def qemu(name, mem, share, incoming=False):
    a = ["qemu-system-x86_64", "-machine", "q35,memory-backend=pc.ram", "-m", "128", "-nodefaults",
         "-display", "none", "-accel", "tcg",
         "-object", f"memory-backend-file,id=pc.ram,size=128M,mem-path={mem},share={share}",
         "-qmp", f"unix:{D}/{name}.qmp,server=on,wait=off"]
    if incoming:
        a += ["-incoming", "defer"]
    return subprocess.Popen(a)


def wait(c):
    while True:
        r = c("query-migrate")["return"]
        if r.get("status") in ("completed", "failed"):
            return r
        time.sleep(0.02)


def ignore_shared(on):
    return [{"capability": "x-ignore-shared", "state": on}]


procs = []
try:
    procs.append(qemu("P", f"{SHM}/p.ram", "on"))
    P = qmp(f"{D}/P.qmp")
    time.sleep(1)
    P("stop")
    P("migrate-set-capabilities", capabilities=ignore_shared(True))
    P("migrate", uri=f"exec:cat > {D}/devstate")
    print("P: device state saved:", wait(P)["status"])
    shutil.copy(f"{SHM}/p.ram", f"{SHM}/t.ram")
    P("cont")

    procs.append(qemu("L", f"{SHM}/t.ram", "off", True))
    L = qmp(f"{D}/L.qmp")
    L("migrate-set-capabilities", capabilities=ignore_shared(True))
    L("migrate-incoming", uri=f"exec:cat {D}/devstate")
    print("L: loaded from the template:", wait(L)["status"], L("query-status")["return"]["status"])

    procs.append(qemu("C", f"{SHM}/c.ram", "on", True))
    C = qmp(f"{D}/C.qmp")
    postcopy = [{"capability": "postcopy-ram", "state": True}]
    print("L caps:", L("migrate-set-capabilities", capabilities=ignore_shared(False) + postcopy))
    print("C caps:", C("migrate-set-capabilities", capabilities=postcopy))
    C("migrate-incoming", uri=f"unix:{D}/mig.sock")
    time.sleep(0.2)
    # Slow postcopy on purpose: C must run while pages still stream.
    L("migrate-set-parameters", **{"max-postcopy-bandwidth": 1 << 18})
    t0 = time.time()
    L("migrate", uri=f"unix:{D}/mig.sock")
    L("migrate-start-postcopy")
    seen = set()
    while True:
        r = L("query-migrate")["return"]
        k = (r["status"], C("query-status")["return"]["status"])
        if k not in seen:
            print(f"{time.time() - t0:.3f} s: L {k[0]}, C {k[1]}")
            seen.add(k)
        if "--kill" in sys.argv and r["status"] == "postcopy-active":
            time.sleep(0.5)
            procs[1].kill()
            time.sleep(1)
            print("L killed; C:", C("query-status")["return"]["status"], C("query-migrate")["return"].get("status"))
            break
        if r["status"] in ("completed", "failed"):
            print("error:", r.get("error-desc"))
            break
        time.sleep(0.02)
finally:
    for p in procs:
        p.kill()
        p.wait()
    shutil.rmtree(D, ignore_errors=True)
    shutil.rmtree(SHM, ignore_errors=True)
