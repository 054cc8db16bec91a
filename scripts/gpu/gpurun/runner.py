"""Running commands: with a time limit, measured (CPU seconds, peak RSS), or only shown in a dry
run; logs and files."""
import os
import shlex
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager

from gpurun.config import OUT, START, TIMEOUT, now


class Failed(Exception):
    """A stage that cannot go on (the message, if any, says why)."""


def log(msg):
    print(f"[gpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def seconds():
    """Whole seconds since the driver started."""
    return int(time.monotonic() - START)


def need(ok, msg):
    """Fails the stage with MSG unless OK (a dry run goes on)."""
    if not ok:
        if not now.dry:
            raise Failed(msg)
        log(f"{msg} (dry run: going on)")


def _environ(env, unset=()):
    e = {k: v for k, v in os.environ.items() if k not in unset}
    e.update(w.partition("=")[::2] for w in env)
    return e


def _shown(cmd, env, out, append, cwd, unset):
    text = " ".join(shlex.quote(str(a)) for a in [*env, *cmd])
    if unset:
        text = "env " + "".join(f"-u {u} " for u in unset) + text
    if out:
        text += f" {'>>' if append else '>'}{shlex.quote(out)} 2>&1"
    return f"(cd {shlex.quote(cwd)} && {text})" if cwd else text


def start(cmd, env=(), out=None, append=False, cwd=None, unset=(), _bg=True):
    """Starts CMD with the VAR=VALUE words of ENV added to the environment (the names in UNSET
    taken out), output and errors to the file OUT. Returns the process, or its exit code where
    there is none (0 in a dry run, which prints the command instead; 127 if it cannot start)."""
    if now.dry:
        print(_shown(cmd, env, out, append, cwd, unset) + (" &" if _bg else ""), flush=True)
        return 0
    f = open(out, "a" if append else "w") if out else None
    try:
        return subprocess.Popen([str(a) for a in cmd], env=_environ(env, unset), cwd=cwd, stdout=f,
                                stderr=subprocess.STDOUT if f else None)
    except OSError as e:
        print(f"{cmd[0]}: {e}", file=f or sys.stderr)
        return 127
    finally:
        if f:
            f.close()


def finish(proc):
    """The exit code of a process from start(), as a shell gives it (128 + N for signal N)."""
    if isinstance(proc, int):
        return proc
    rc = proc.wait()
    return 128 - rc if rc < 0 else rc


def execute(cmd, env=(), out=None, append=False, cwd=None, unset=()):
    """Runs CMD as start() does and returns its exit code."""
    return finish(start(cmd, env, out, append, cwd, unset, _bg=False))


def capture(cmd, env=(), merge=False):
    """Runs CMD and returns (its exit code, its output; with MERGE its errors too)."""
    if now.dry:
        print(_shown(cmd, env, None, False, None, ()), flush=True)
        return 0, ""
    try:
        p = subprocess.run([str(a) for a in cmd], env=_environ(env), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT if merge else None, text=True, errors="replace")
    except OSError as e:
        print(f"{cmd[0]}: {e}", file=sys.stderr)
        return 127, ""
    return (128 - p.returncode if p.returncode < 0 else p.returncode), p.stdout


def probe(cmd, placeholder):
    """CMD's output less its last newline ("" where it cannot run); PLACEHOLDER in a dry run."""
    if now.dry:
        return placeholder
    try:
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout.rstrip("\n")
    except OSError:
        return ""


def timed(cmd, secs=None, kill=True):
    """CMD under timeout(1): SECS (default $TIMEOUT), then with KILL a SIGKILL 10 s later."""
    return ["timeout", *(["-k", "10"] if kill else []), secs or TIMEOUT, *cmd]


def logf(name):
    return f"{OUT}/logs/{name}.log"


def measured(name, cmd):
    """CMD under scripts/gpu/measure.py, which writes its CPU seconds and memory to NAME.cost."""
    if not now.dry and os.path.exists(f"{OUT}/logs/{name}.cost"):
        os.remove(f"{OUT}/logs/{name}.cost")
    return ["python3", "scripts/gpu/measure.py", f"{OUT}/logs/{name}.cost", *cmd]


def cost(name):
    try:
        with open(f"{OUT}/logs/{name}.cost") as f:
            return f.read().rstrip("\n")
    except OSError:
        return ""


def mkdirs(*paths):
    for p in paths:
        if now.dry:
            print(f"mkdir -p {shlex.quote(p)}")
        else:
            os.makedirs(p, exist_ok=True)


def remove(path):
    if now.dry:
        print(f"rm -rf {shlex.quote(path)}")
    else:
        shutil.rmtree(path, ignore_errors=True)


def sleep(secs):
    if not now.dry:
        time.sleep(secs)


def export(name, value):
    if now.dry:
        print(f"export {name}={shlex.quote(value)}")
    os.environ[name] = value


def prepend_library_path(path):
    old = os.environ.get("LD_LIBRARY_PATH", "")
    if not old.startswith(f"{path}:"):
        export("LD_LIBRARY_PATH", f"{path}:{old}")


@contextmanager
def overriding(**settings):
    """The environment with SETTINGS while the block runs (a stage run with other settings)."""
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def lines(path):
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []


def executable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def failed_build(rc, path, tail):
    """Fails the stage, with the last TAIL lines of the build log PATH, where RC says it failed."""
    if rc:
        sys.stderr.write("".join(f"{line}\n" for line in lines(path)[-tail:]))
        raise Failed()
