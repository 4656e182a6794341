#!/usr/bin/env python3
"""Runs the README's (or a guide's) commands as a new user would copy them, and fails on the first
that fails.

Every ```sh block of README.md (or of each --file, or of every docs/guides/*.md with --guides)
runs, in order, as one bash script (so `F=...` carries to the
lines after it) with `set -e`, in a scratch directory that links the repository's top-level
entries (so ./build/apps/ashlar and ops/configs/... resolve and outputs such as r.json land
in the scratch directory; each file gets a scratch directory of its own), with HOME in the scratch directory (cluster tokens under
~/.ashlar) and the `ashlar` of `bash ops/install.sh PREFIX` first on PATH, as the README
tells a user to install it. What a user does by hand is done by this script:

  - `ashlar node ...` is a daemon a user starts in its own shell: it runs in the background,
    its output in node-N.log, and the next line waits until it has joined its cluster
    (a `--listen HOST:PORT` node first waits for the port to be free). Daemons left at the end
    of a block get SIGTERM (then SIGKILL after 30 s).
  - `SCHEDULER:` (the multi-host placeholder) is 127.0.0.1.
  - Without --all, a leading `bash ops/install-deps.sh ... &&` and `bash ops/build.sh &&` are
    dropped (.ci/run and the test build did them), and blocks marked
    `<!-- readme-run: long REASON -->` (benchmarks, minutes each) are listed, not run.
    `<!-- readme-run: skip REASON -->` blocks never run; the reason is printed.
    `<!-- readme-run: smoke WHAT -->` blocks run as any other; with --smoke only they run
    (the suite's quick check of the README; the whole README is a `long` test).

A block fails on a non-zero exit, on a daemon that exits before it joins, or on output that
no command should print (a crash, an uncaught exception, a sanitizer report).

  python3 ops/readme-run.py            # README.md: what CI runs (a ctest)
  python3 ops/readme-run.py --all      # also the long blocks
  python3 ops/readme-run.py --list     # the blocks and what this script does with each
  python3 ops/readme-run.py --only 445 # one block, by the line of its fence
  python3 ops/readme-run.py --smoke    # only the blocks marked smoke
  python3 ops/readme-run.py --file docs/guides/checkpoints.md   # a guide's commands (repeatable)
  python3 ops/readme-run.py --guides   # every guide under docs/guides, one after another
"""
import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BAD_OUTPUT = re.compile(r"terminate called|Segmentation fault|core dumped|Aborted|AddressSanitizer|"
                        r"runtime error:|Traceback \(most recent call last\)")
SETUP = re.compile(r"^\s*(bash ops/install-deps\.sh[^&]*&&\s*)?(bash ops/build\.sh\s*&&\s*)?")

HELPERS = r'''
set -euo pipefail
__n=0
__pids=()
__wait_port_free() {  # HOST:PORT: until nothing listens there (a scheduler of before exits)
  local port=${1##*:}
  for _ in $(seq 1 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || return 0
    sleep 0.1
  done
  echo "readme-run: port $port still in use after 30 s" >&2; return 1
}
__daemon() {  # starts `ashlar node ARGS` in the background, waits until it has joined
  __n=$((__n + 1))
  local log="node-$__n.log" listen=""
  local prev=""
  for a in "$@"; do [ "$prev" = "--listen" ] && listen=$a; prev=$a; done
  [ -n "$listen" ] && __wait_port_free "$listen"
  echo "readme-run: \$ $* &   (output in $log)"
  # Started from a subshell, so the block's own `wait` (for its `&` commands) skips it,
  # as a daemon in another shell would be.
  ( "$@" > "$log" 2>&1 & echo $! > "$log.pid" )
  local pid
  pid=$(cat "$log.pid")
  __pids+=("$pid")
  for _ in $(seq 1 600); do
    if grep -qE "joined the cluster|scheduler listening on" "$log"; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "readme-run: the node exited before it joined:" >&2; cat "$log" >&2; return 1
    fi
    sleep 0.1
  done
  echo "readme-run: the node did not join within 60 s:" >&2; cat "$log" >&2; return 1
}
__stop_daemons() {
  for p in "${__pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for _ in $(seq 1 300); do
    local alive=0
    for p in "${__pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && return 0
    sleep 0.1
  done
  for p in "${__pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap __stop_daemons EXIT
'''


def blocks(readme):
    """(line, directive, text) of every ```sh block; directive from a comment just above."""
    lines = open(readme).read().split("\n")
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```sh":
            directive = ""
            for back in range(1, 4):
                m = re.match(r"\s*<!--\s*readme-run:\s*(.*?)\s*-->", lines[i - back]) if i >= back else None
                if m:
                    directive = m.group(1)
                    break
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            out.append((i + 1, directive, "\n".join(lines[i + 1:j])))
            i = j
        i += 1
    return out


def commands(text):
    """The block's commands: continuation lines joined, comment-only lines dropped."""
    joined, cur = [], ""
    for line in text.split("\n"):
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        if cur.strip() and not cur.strip().startswith("#"):
            joined.append(cur.strip())
        cur = ""
    return joined


def script_of(cmds, full):
    body = [HELPERS]
    for c in cmds:
        if not full:
            c = SETUP.sub("", c, count=1)
        c = c.replace("SCHEDULER:", "127.0.0.1:")
        words = shlex.split(c, comments=True)
        if words[:2] == ["ashlar", "node"] and "--exit-after-job" not in words:
            body.append("__daemon " + c)  # bash expands "$F" and drops the comment
        else:
            body.append(f"echo {shlex.quote('readme-run: $ ' + c)}")
            body.append(c)
    return "\n".join(body) + "\n"


def plan_of(path, args):
    """(line, commands or None, why not run) for each ```sh block of PATH."""
    plan = []
    for line, directive, text in blocks(path):
        kind, _, reason = directive.partition(" ")
        if args.only and line != args.only:
            plan.append((line, None, "not the --only block"))
        elif args.smoke and kind != "smoke":
            plan.append((line, None, "not a smoke block"))
        elif kind == "skip" or (kind == "long" and not args.all):
            plan.append((line, None, f"{kind}: {reason}"))
        else:
            plan.append((line, commands(text), ""))
    return plan


def run_file(path, plan, work, env, args):
    """Runs PLAN's blocks in WORK (a scratch directory linking the repository's entries);
    returns the number of blocks that failed (0 or 1: it stops at the first)."""
    name = os.path.relpath(path, ROOT)
    os.makedirs(work, exist_ok=True)
    for entry in os.listdir(ROOT):
        dst = os.path.join(work, entry)
        if entry != ".git" and not os.path.lexists(dst):
            os.symlink(os.path.join(ROOT, entry), dst)
    env = dict(env)
    env["HOME"] = os.path.join(work, "home")
    os.makedirs(env["HOME"], exist_ok=True)
    print(f"readme-run: {name} in {work}")
    for line, cmds, why in plan:
        if cmds is None:
            print(f"\n== {name}:{line}: not run ({why})")
            continue
        print(f"\n== {name}:{line}: {len(cmds)} command(s)", flush=True)
        script = os.path.join(work, f"block-{line}.sh")
        with open(script, "w") as f:
            f.write(script_of(cmds, args.all))
        start = time.time()
        # Its own process group: on a timeout the block and every daemon it started end.
        proc = subprocess.Popen(["bash", script], cwd=work, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=args.timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
                time.sleep(5)
            out, _ = proc.communicate()
            rc = f"timeout after {args.timeout:g} s"
        logs = ""
        for entry in sorted(os.listdir(work)):
            if entry.startswith("node-") and entry.endswith(".log.pid"):
                os.remove(os.path.join(work, entry))
            elif entry.startswith("node-") and entry.endswith(".log"):
                logs += open(os.path.join(work, entry), errors="replace").read()
                os.rename(os.path.join(work, entry), os.path.join(work, f"block-{line}-{entry}"))
        sys.stdout.write(out)
        bad = BAD_OUTPUT.search(out + logs)
        if rc != 0 or bad:
            why = f"exit {rc}" if rc != 0 else f"printed '{bad.group(0)}'"
            print(f"== {name}:{line}: FAILED ({why}, {time.time() - start:.0f} s); files in {work}")
            return 1
        print(f"== {name}:{line}: ok ({time.time() - start:.0f} s)")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all", action="store_true", help="also the long blocks and the setup commands")
    ap.add_argument("--list", action="store_true", help="list the blocks and what would run")
    ap.add_argument("--keep", metavar="DIR", help="run in DIR (kept) instead of a temporary directory")
    ap.add_argument("--file", "--readme", dest="files", action="append", metavar="FILE",
                    help="a Markdown file whose blocks to run (repeatable; default README.md)")
    ap.add_argument("--guides", action="store_true", help="every docs/guides/*.md, in name order")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per block (default 900)")
    ap.add_argument("--only", type=int, metavar="LINE", help="run only the block whose fence is on line LINE")
    ap.add_argument("--smoke", action="store_true", help="run only the blocks marked <!-- readme-run: smoke -->")
    args = ap.parse_args()

    files = []
    for f in args.files or []:
        path = f if os.path.isabs(f) or os.path.exists(f) else os.path.join(ROOT, f)
        if not os.path.isfile(path):
            print(f"readme-run: no such file: {f}", file=sys.stderr)
            return 2
        files.append(os.path.abspath(path))
    if args.guides:
        guides = os.path.join(ROOT, "docs", "guides")
        files += [os.path.join(guides, g) for g in sorted(os.listdir(guides)) if g.endswith(".md")]
    if not files:
        files = [os.path.join(ROOT, "README.md")]
    plans = [(path, plan_of(path, args)) for path in files]
    if args.list:
        for path, plan in plans:
            for line, cmds, why in plan:
                print(f"{os.path.relpath(path, ROOT)}:{line}: " + (why if cmds is None else f"runs {len(cmds)} command(s)"))
        return 0

    if not os.access(os.path.join(ROOT, "build/apps/ashlar"), os.X_OK):
        print("readme-run: build/apps/ashlar is missing: run bash ops/build.sh first", file=sys.stderr)
        return 2
    work = args.keep or tempfile.mkdtemp(prefix="ashlar-readme-")
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ)
    env.pop("ASHLAR_HOME", None)
    prefix = os.path.join(work, "prefix")
    # The README's install step: `bash ops/install.sh PREFIX`, PREFIX/bin on PATH.
    r = subprocess.run(["bash", os.path.join(ROOT, "ops/install.sh"), prefix], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(r.stdout, "readme-run: bash ops/install.sh failed", file=sys.stderr)
        return 1
    env["PATH"] = os.path.join(prefix, "bin") + os.pathsep + env["PATH"]
    print(f"readme-run: `ashlar` and `ashlar-plot` from {prefix}/bin")

    failed = 0
    for path, plan in plans:
        # One file: the scratch directory itself (as before); several: one under it each.
        sub = work if len(plans) == 1 else os.path.join(work, os.path.splitext(os.path.basename(path))[0])
        failed = run_file(path, plan, sub, env, args)
        if failed:
            break
    if not failed and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    print("\nreadme-run: " + ("every command ran" if not failed else "a block failed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
