"""Two installs of kvserve in two folders, each started twice (a, b, a, b): time from launch to the
"serving" line, and whether a kernel build ran (its stderr lines).

    python scripts/two_installs.py [WORKDIR]      # default /tmp/twoinst; clones this repository twice

Each install is a fresh clone with its own venv and `bash scripts/install.sh` (pip's cache makes
it mostly offline). The report is printed and written to WORKDIR/report.txt.
"""
import os, subprocess, sys, time, json, socket, urllib.request
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/twoinst"
os.makedirs(ROOT, exist_ok=True)
def sh(cmd, **kw):
    return subprocess.run(cmd, shell=True, check=True, **kw)
def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
log = open(f"{ROOT}/report.txt", "w")
def say(text):
    print(text, flush=True); log.write(text + "\n"); log.flush()
for n in ("a", "b"):
    d = f"{ROOT}/kv_{n}"
    sh(f"rm -rf {d} && git clone -q {REPO} {d} && python3 -m venv {d}/.venv")
    t = time.time()
    sh(f"cd {d} && . .venv/bin/activate && bash scripts/install.sh > {ROOT}/install_{n}.log 2>&1")
    tail = open(f"{ROOT}/install_{n}.log").read().strip().splitlines()[-3:]
    say(f"install {n} ({d}, commit {subprocess.check_output(['git','-C',d,'rev-parse','--short','HEAD'],text=True).strip()}): {time.time()-t:.0f} s; last lines: {tail}")
for round_ in (1, 2):
    for n in ("a", "b"):
        d = f"{ROOT}/kv_{n}"; port = free_port()
        t = time.time()
        p = subprocess.Popen(f"cd {d} && . .venv/bin/activate && exec kvserve serve --host 127.0.0.1 --port {port} --log-level warning",
                             shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = p.stdout.readline()
        ready = time.time() - t
        ok = urllib.request.urlopen(f"http://127.0.0.1:{port}/health").status
        p.terminate(); out, err = p.communicate(timeout=60)
        built = [l for l in err.splitlines() if "building the C++" in l or "kernels built" in l]
        say(f"round {round_} install {n}: ready in {ready:.1f} s (health {ok}); kernel build lines: {built or 'none'}; first line: {line.strip()[:80]}")
