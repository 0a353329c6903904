#!/usr/bin/env python3
"""Follow README.md top to bottom, as one reader in one sitting, and check what it shows.

Usage: python3 .ci/readme_check.py [TIDEMARK_BIN]   (or env TIDEMARK_BIN; default target/debug/tidemark)
       (env README_FILE=other.md checks another file of the same form: for testing the runner)
Called by .ci/readme.sh, which CI runs after the test build (.ci/run).

What it runs
  * Every ```sh block of README.md, in order, in ONE fresh scratch directory (mktemp -d), with
    `tidemark` on PATH pointing at the given binary, HOME set to an empty directory inside the
    scratch directory (so `~/...` paths stay in it) and no TIDEMARK_* variables from the caller.
  * A ```toml block whose first line is `# NAME.toml` is written to NAME.toml in the scratch
    directory (the reader saves it under that name). Other blocks (rust, ...) are not run.
  * A command is one line, or several while the shell needs more (open quotes, a trailing `\\`
    or `|`; checked with `bash -n`). Each runs as `bash -o pipefail -c COMMAND` in the scratch
    directory (so a `cd` or a variable does not carry over to the next command), with a 30 s
    timeout; a non-zero exit status is a failure.

Substitutions and skips (printed as they happen)
  * `cargo run [FLAGS] -- ARGS` runs `tidemark ARGS` (the package's binary, built already: CI
    hands over target/debug/tidemark), e.g. `cargo run --release -- serve` -> `tidemark serve`.
  * `cargo test ...`, `cargo run --example ...`, `cargo install ...` and any other cargo command
    are skipped with the reason printed: .ci/run runs the tests and the examples itself.

Long-running commands (detected by the command, no markers)
  * `tidemark [GLOBAL OPTIONS] serve ...` (not `--print-config`/`--help`): a node. It runs in the
    background (its own process group, output in a log); the runner waits for its
    "serving HTTP on URL" line and then for URL/readyz to answer 200 (20 s), and aborts the run if
    it exits or never gets ready. A node keeps running after its block (the README's "in another
    terminal") until a stop step (below) or the end of the run.
  * `tidemark [GLOBAL OPTIONS] watch ...` and `curl` with `-N`/`--no-buffer` (SSE): run in the
    background and stopped with SIGINT (Ctrl-C) at the end of their block; one that exited on its
    own with a non-zero status before that is a failure.
  * A stop step: a comment on its own line in a sh block that says "stop" and "Ctrl-C", e.g.
    `# Stop the nodes above (Ctrl-C), then:`. Every node still running gets SIGINT there (as the
    reader presses Ctrl-C in its terminal) and must exit with status 0 within 15 s.
  * At the end of the run, and on any failure or signal, everything started is stopped (SIGINT,
    then SIGKILL after 10 s), by process group.

Shown outputs (the rules)
  * Only comment lines on their own lines, DIRECTLY below a command (no blank line between), are
    expected output. A comment after a command on the same line (`tidemark get x   # TYPE KEY
    VALUE ...`) is a description and never compared; so is a comment after a blank line.
  * If the first such line starts with `{` or `[`, it is the command's JSON output: stdout is
    parsed and must equal it as JSON (key order and spacing do not matter). The JSON may be
    followed by `(send it again: JSON)`: the runner runs the command a second time and compares
    that output with the second JSON. Anything else after the JSON is an error in the README.
    Lines below a JSON line are not compared.
  * Otherwise all those comment lines are the command's text output (a table): stdout must have
    the same lines, compared with runs of spaces collapsed and trailing spaces ignored.
  * `…` stands for anything: as a JSON value (`"received_ms":…` or `"node":"…"`) it matches any
    value; inside a JSON string or a text line it matches any run of characters.
  * A failure names the README line, the command, the expected and the actual output. The run
    goes on after a failed command or comparison (a node that does not start ends it) and exits 1
    if anything failed.
"""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
README = os.environ.get("README_FILE") or os.path.join(ROOT, "README.md")  # README_FILE: to test the runner
COMMAND_TIMEOUT = 30
READY_TIMEOUT = 20
STOP_TIMEOUT = 15
RUN_DEADLINE = 150  # seconds for the whole run: a hang must not hold CI

STOP_STEP = re.compile(r"^#.*\bstop\b.*ctrl-c|^#.*ctrl-c.*\bstop\b", re.IGNORECASE)
SERVING = re.compile(r"serving HTTP on (https?://\S+)")
ELLIPSIS = "\u2026"

failures = []
started = []  # every background process: dicts with kind, proc, line, cmd, log


class Abort(Exception):
    pass


def say(msg):
    print(msg, flush=True)


def short(cmd):
    first = cmd.splitlines()[0]
    return first + (" ..." if "\n" in cmd else "")


def fail(line, cmd, what, expected=None, actual=None, stderr=None):
    msg = ["FAIL README.md:%d: %s" % (line, what), "  command: " + cmd.replace("\n", "\n           ")]
    if expected is not None:
        msg.append("  expected: " + expected.replace("\n", "\n            "))
    if actual is not None:
        msg.append("  actual:   " + (actual.rstrip("\n") or "(nothing)").replace("\n", "\n            "))
    if stderr:
        msg.append("  stderr:   " + stderr.rstrip("\n").replace("\n", "\n            "))
    failures.append(msg[0])
    say("\n".join(msg))


# ---------------------------------------------------------------- README parsing


def blocks(path):
    """Yield (lang, first_line_number, [(line_number, text)]) for every fenced block."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^```\s*([\w+-]*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        lang, start, body = m.group(1), i + 1, []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append((i + 1, lines[i]))
            i += 1
        yield lang, start, body
        i += 1


def complete(text):
    if text.rstrip().endswith("\\"):
        return False
    r = subprocess.run(["bash", "-n", "-c", text], capture_output=True, text=True)
    return r.returncode == 0


def items(body):
    """Split a sh block into ('cmd', line, text, expected_comments) / ('comment', line, text) / ('blank',)."""
    out, i = [], 0
    while i < len(body):
        n, text = body[i]
        s = text.strip()
        if not s:
            out.append(("blank", n, ""))
            i += 1
            continue
        if s.startswith("#"):
            out.append(("comment", n, s))
            i += 1
            continue
        cmd_lines = [text]
        while not complete("\n".join(cmd_lines)) and i + len(cmd_lines) < len(body):
            cmd_lines.append(body[i + len(cmd_lines)][1])
        i += len(cmd_lines)
        expected = []
        while i < len(body) and body[i][1].strip().startswith("#") and not STOP_STEP.search(body[i][1].strip()):
            expected.append((body[i][0], body[i][1].strip()[1:].strip()))
            i += 1
        out.append(("cmd", n, "\n".join(cmd_lines), expected))
    return out


# ---------------------------------------------------------------- expectations


def bare_ellipsis_to_string(text):
    """`…` outside JSON strings becomes the string "…" (the wildcard), so the text parses."""
    res, in_str, esc = [], False, False
    for ch in text:
        if in_str:
            res.append(ch)
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
            res.append(ch)
        elif ch == ELLIPSIS:
            res.append('"' + ELLIPSIS + '"')
        else:
            res.append(ch)
    return "".join(res)


def parse_expected_json(comment):
    """-> (first_json, again_json_or_None); raises ValueError on a malformed expectation."""
    text = bare_ellipsis_to_string(comment)
    dec = json.JSONDecoder()
    first, end = dec.raw_decode(text)
    rest = text[end:].strip()
    if not rest:
        return first, None
    m = re.match(r"^\(send it again:\s*(.*)\)$", rest)
    if not m:
        raise ValueError("unexpected text after the JSON: %r" % rest)
    again, end2 = dec.raw_decode(m.group(1).strip())
    if m.group(1).strip()[end2:].strip():
        raise ValueError("unexpected text after the second JSON: %r" % rest)
    return first, again


def glob_match(pattern, s):
    rx = "".join(".*" if c == ELLIPSIS else re.escape(c) for c in pattern)
    return re.fullmatch(rx, s, re.DOTALL) is not None


def json_match(exp, act):
    if exp == ELLIPSIS:
        return True
    if isinstance(exp, str) and ELLIPSIS in exp:
        return isinstance(act, str) and glob_match(exp, act)
    if isinstance(exp, dict):
        return isinstance(act, dict) and exp.keys() == act.keys() and all(json_match(exp[k], act[k]) for k in exp)
    if isinstance(exp, list):
        return isinstance(act, list) and len(exp) == len(act) and all(json_match(e, a) for e, a in zip(exp, act))
    if isinstance(exp, bool) or isinstance(act, bool):
        return type(exp) is type(act) and exp == act
    return exp == act


def first_difference(exp, act, path="$"):
    """Where two JSON values first differ (for the failure message), or None."""
    if json_match(exp, act):
        return None
    if isinstance(exp, dict) and isinstance(act, dict):
        for k in list(exp) + [k for k in act if k not in exp]:
            if k not in act:
                return "%s.%s: missing in the output" % (path, k)
            if k not in exp:
                return "%s.%s: not in the README (%s)" % (path, k, json.dumps(act[k], ensure_ascii=False))
            d = first_difference(exp[k], act[k], "%s.%s" % (path, k))
            if d:
                return d
    if isinstance(exp, list) and isinstance(act, list):
        for i, (e, a) in enumerate(zip(exp, act)):
            d = first_difference(e, a, "%s[%d]" % (path, i))
            if d:
                return d
        if len(exp) != len(act):
            return "%s: %d elements in the README, %d in the output" % (path, len(exp), len(act))
    return "%s: README %s, output %s" % (path, json.dumps(exp, ensure_ascii=False), json.dumps(act, ensure_ascii=False))


def norm(line):
    return re.sub(r"\s+", " ", line).strip()


# ---------------------------------------------------------------- commands


def substitute(cmd):
    """-> (command_to_run, None) or (None, reason_to_skip)."""
    try:
        words = shlex.split(cmd, comments=True)
    except ValueError:
        return cmd, None
    if not words or words[0] != "cargo":
        return cmd, None
    sub = words[1] if len(words) > 1 else ""
    if sub == "test":
        return None, "cargo test: CI runs the tests itself (.ci/run, == tests)"
    if sub == "install":
        return None, "cargo install: the runner puts the given binary on PATH as `tidemark` instead"
    if sub == "run" and "--example" in words:
        return None, "cargo run --example: CI runs every example itself (.ci/run, == examples run)"
    if sub == "run" and "--" in words:
        args = words[words.index("--") + 1:]
        return "tidemark " + " ".join(shlex.quote(a) for a in args), None
    return None, "cargo %s: not run by the README runner" % sub


def kind_of(cmd):
    """'serve', 'watch' (stopped at the end of its block) or None (runs to completion)."""
    try:
        words = shlex.split(cmd, comments=True)
    except ValueError:
        return None
    if "|" in words:
        words = words[: words.index("|")]
    if not words:
        return None
    if words[0] == "tidemark":
        i = 1
        while i < len(words) and words[i].startswith("-"):
            i += 1 if ("=" in words[i] or words[i] == "--json") else 2
        sub = words[i] if i < len(words) else ""
        if sub == "serve" and not {"--print-config", "--help", "-h"} & set(words):
            return "serve"
        if sub == "watch":
            return "watch"
    if words[0] == "curl":
        for w in words[1:]:
            if w == "--no-buffer" or (re.fullmatch(r"-[a-zA-Z]+", w) and "N" in w):
                return "watch"
    return None


class Runner:
    def __init__(self, binary):
        self.scratch = tempfile.mkdtemp(prefix="tidemark-readme.")
        self.work = os.path.join(self.scratch, "work")  # the reader's directory
        self.logs = os.path.join(self.scratch, "logs")
        bindir = os.path.join(self.scratch, "bin")
        home = os.path.join(self.scratch, "home")
        for d in (self.work, self.logs, bindir, home):
            os.makedirs(d)
        os.symlink(binary, os.path.join(bindir, "tidemark"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
        env.update(PATH=bindir + os.pathsep + env.get("PATH", "/usr/bin:/bin"), HOME=home, NO_COLOR="1")
        self.env = env
        self.block_watchers = []

    def run(self, cmd):
        return subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=self.work, env=self.env,
                              capture_output=True, text=True, timeout=COMMAND_TIMEOUT)

    def background(self, kind, line, cmd):
        log = os.path.join(self.logs, "%s-line%d.log" % (kind, line))
        f = open(log, "w")
        proc = subprocess.Popen(["bash", "-o", "pipefail", "-c", cmd], cwd=self.work, env=self.env,
                                stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        f.close()
        p = dict(kind=kind, proc=proc, line=line, cmd=cmd, log=log)
        started.append(p)
        return p

    def wait_ready(self, p):
        deadline = time.time() + READY_TIMEOUT
        url = None
        while time.time() < deadline:
            if p["proc"].poll() is not None:
                break
            if url is None:
                m = SERVING.search(read(p["log"]))
                url = m.group(1).rstrip("/.,;)") if m else None
            if url:
                try:
                    with urllib.request.urlopen(url + "/readyz", timeout=2) as r:
                        if r.status == 200:
                            return url
                except Exception:
                    pass
            time.sleep(0.1)
        state = "exited with status %s" % p["proc"].returncode if p["proc"].poll() is not None else \
            "not ready after %d s" % READY_TIMEOUT
        fail(p["line"], p["cmd"], "the node %s (no ready /readyz)" % state, actual=tail(p["log"]))
        raise Abort("a node of the README did not start; later commands need it")

    def command(self, line, cmd, expected):
        torun, skip = substitute(cmd)
        if skip:
            say("README.md:%d: skip `%s`: %s" % (line, short(cmd), skip))
            return
        note = "" if torun == cmd else "   (runs `%s`)" % torun
        kind = kind_of(torun)
        if kind == "serve":
            p = self.background("serve", line, torun)
            url = self.wait_ready(p)
            say("README.md:%d: $ %s%s\n    node ready at %s (pid %d; stays up until a stop step or the end)"
                % (line, short(cmd), note, url, p["proc"].pid))
            return
        if kind == "watch":
            p = self.background("watch", line, torun)
            self.block_watchers.append(p)
            time.sleep(0.5)
            say("README.md:%d: $ %s%s\n    running in the background until the end of this block (Ctrl-C)"
                % (line, short(cmd), note))
            return
        say("README.md:%d: $ %s%s" % (line, short(cmd), note))
        try:
            r = self.run(torun)
        except subprocess.TimeoutExpired as e:
            fail(line, cmd, "timed out after %d s" % COMMAND_TIMEOUT, actual=e.stdout or "")
            return
        if r.returncode != 0:
            fail(line, cmd, "exit status %d" % r.returncode, actual=r.stdout, stderr=r.stderr)
            return
        if expected:
            self.compare(line, cmd, torun, expected, r)

    def compare(self, line, cmd, torun, expected, r):
        eline, etext = expected[0]
        if etext.startswith("{") or etext.startswith("["):
            try:
                first, again = parse_expected_json(etext)
            except ValueError as e:
                fail(eline, cmd, "the README's expected output does not parse: %s" % e, expected=etext)
                return
            self.compare_json(eline, cmd, first, r, "")
            if again is not None:
                r2 = self.run(torun)
                if r2.returncode != 0:
                    fail(eline, cmd, "sent again: exit status %d" % r2.returncode, actual=r2.stdout, stderr=r2.stderr)
                else:
                    self.compare_json(eline, cmd, again, r2, "sent again: ")
            return
        want = [norm(t) for _, t in expected]
        got = [norm(t) for t in r.stdout.rstrip("\n").split("\n")]
        if len(want) != len(got) or not all(glob_match(w, g) for w, g in zip(want, got)):
            at = next((i for i, (w, g) in enumerate(zip(want, got)) if not glob_match(w, g)), min(len(want), len(got)))
            fail(eline + at if at < len(expected) else eline, cmd,
                 "output differs from the README (text, spaces collapsed; first at output line %d)" % (at + 1),
                 expected="\n".join(t for _, t in expected), actual=r.stdout, stderr=r.stderr)
        else:
            say("    output as shown (%d lines)" % len(want))

    def compare_json(self, eline, cmd, exp, r, again):
        shown = json.dumps(exp, ensure_ascii=False, separators=(",", ":"))
        try:
            act = json.loads(r.stdout)
        except ValueError:
            fail(eline, cmd, again + "output is not JSON", expected=shown, actual=r.stdout, stderr=r.stderr)
            return
        if json_match(exp, act):
            say("    %soutput as shown: %s" % (again, shown if len(shown) < 100 else shown[:97] + "..."))
        else:
            fail(eline, cmd, "%soutput differs from the README (JSON; at %s)" % (again, first_difference(exp, act)), expected=shown,
                 actual=json.dumps(act, ensure_ascii=False, separators=(",", ":")))

    def end_block(self):
        for p in self.block_watchers:
            rc = p["proc"].poll()
            if rc is not None and rc != 0:
                fail(p["line"], p["cmd"], "exited with status %d before Ctrl-C" % rc, actual=tail(p["log"]))
                continue
            if rc is None:
                stop(p, STOP_TIMEOUT)
            n = len([x for x in read(p["log"]).split("\n") if x.strip()])
            say("    README.md:%d: stopped `%s` (Ctrl-C); it printed %d line(s)" % (p["line"], short(p["cmd"]), n))
        self.block_watchers = []

    def stop_nodes(self, where):
        for p in [p for p in started if p["kind"] == "serve" and p["proc"].poll() is None]:
            rc = stop(p, STOP_TIMEOUT)
            if rc != 0:
                fail(p["line"], p["cmd"], "the node did not stop cleanly on Ctrl-C (status %s)" % rc, actual=tail(p["log"]))
            else:
                say("    %s: stopped the node of README.md:%d (Ctrl-C, status 0)" % (where, p["line"]))

    def follow(self):
        say("== README.md, followed top to bottom in %s (tidemark = %s)" % (self.work, self.env["PATH"].split(os.pathsep)[0] + "/tidemark"))
        for lang, start, body in blocks(README):
            if lang == "toml" and body and re.match(r"^#\s*(\S+\.toml)\s*$", body[0][1]):
                name = re.match(r"^#\s*(\S+\.toml)\s*$", body[0][1]).group(1)
                with open(os.path.join(self.work, name), "w") as f:
                    f.write("\n".join(t for _, t in body) + "\n")
                say("README.md:%d: wrote the toml block to %s" % (start, name))
                continue
            if lang != "sh":
                continue
            for it in items(body):
                if it[0] == "comment" and STOP_STEP.search(it[2]):
                    say("README.md:%d: %s" % (it[1], it[2]))
                    self.stop_nodes("README.md:%d" % it[1])
                elif it[0] == "cmd":
                    self.command(it[1], it[2], it[3])
            self.end_block()


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def tail(path, n=15):
    return "\n".join(read(path).rstrip("\n").split("\n")[-n:])


def stop(p, timeout):
    """SIGINT the process group (Ctrl-C), SIGKILL after `timeout`; returns the exit status."""
    proc = p["proc"]
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            return "killed after %d s" % timeout
    return proc.returncode


def cleanup():
    for p in started:
        if p["proc"].poll() is None:
            stop(p, 10)
        else:
            try:  # a process group outliving its leader (a pipeline's other side)
                os.killpg(p["proc"].pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def on_signal(signum, _frame):
    raise Abort("signal %d" % signum)


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TIDEMARK_BIN", os.path.join(ROOT, "target/debug/tidemark"))
    binary = os.path.abspath(binary)
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        say("readme: no tidemark binary at %s (give a path or set TIDEMARK_BIN)" % binary)
        return 2
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM):
        signal.signal(s, on_signal)
    signal.alarm(RUN_DEADLINE)
    t0 = time.time()
    runner = Runner(binary)
    try:
        runner.follow()
    except Abort as e:
        failures.append("aborted: %s" % e)
        say("ABORT: %s" % e)
    finally:
        signal.alarm(0)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        runner.end_block()
        runner.stop_nodes("end of the README")
        cleanup()
    took = time.time() - t0
    if failures:
        say("== README check FAILED (%d problem(s), %.1f s; scratch directory kept: %s):" % (len(failures), took, runner.scratch))
        for f in failures:
            say("  " + f)
        return 1
    shutil.rmtree(runner.scratch, ignore_errors=True)
    say("== README check passed (%.1f s): every command ran, every shown output matched" % took)
    return 0


if __name__ == "__main__":
    sys.exit(main())
