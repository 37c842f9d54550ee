"""Just enough of a POSIX shell to read the command lines of veRL's example scripts without running
them (they download models, start clusters and train).

``ShellReader(text).commands()`` follows the script top to bottom: it records variable assignments
(``NAME=value``, ``export NAME=...``, arrays ``NAME=(a b c)``) and yields every other command as a
list of words, with quotes removed and these expansions done:

- ``$NAME``, ``${NAME}``, ``${NAME:-default}``, ``${NAME-default}``, ``${NAME:=default}``; ``"${ARR[@]}"``
  expands to the array's words; ``$@``, ``$*`` and ``$1``.. are empty (the script got no arguments).
- ``$HOME`` is ``/root`` unless the script sets it; ``$PWD``/``$(pwd)`` is the working directory the
  script is meant to run from (``cwd``); ``$(dirname ...)``-style script-location idioms give the
  script's directory.
- Any other command substitution ``$(...)`` / backticks, and a variable that is never set, become
  the marker ``UNSET`` + name (``UNSET_NNODES``); the caller decides what to put there (the checker
  puts hybridflow's default of the key the word sets).
- Arithmetic ``$((...))`` is evaluated when every variable in it is a known integer.

Control flow: ``if`` follows the branch whose condition is a decidable string test (else the first
branch); loop bodies are read once with the loop variable unset. That is enough for veRL's examples,
which set variables and call Python.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ShellReader", "UNSET", "Command"]

UNSET = "UNSET_"
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ASSIGN = re.compile(rf"^(?:export\s+|local\s+|readonly\s+|declare(?:\s+-\w+)*\s+)?({_NAME})(\+?)=(.*)$", re.S)
_OPERATORS = ("&&", "||", ";", "|", "&")


@dataclass
class Command:
    words: list[str]
    line: int  # 1-based line of the command's first word


@dataclass
class ShellReader:
    text: str
    script_dir: str = "."
    cwd: str = "."  # where the script is meant to run from (veRL's: the top of the checkout)
    env: dict[str, object] = field(default_factory=dict)

    def __post_init__(self):
        self.env.setdefault("HOME", "/root")
        self.env.setdefault("PWD", self.cwd)

    # ------------------------------------------------------------------ lines

    def _logical_lines(self) -> Iterator[tuple[int, str]]:
        """(first line number, text) of each logical line: continuations joined, comments dropped,
        and lines joined while a quote or a parenthesis is open."""
        buf, start, depth, quote = "", 0, 0, None
        for number, line in enumerate(self.text.splitlines(), 1):
            if not buf:
                start = number
            stripped, depth, quote = self._strip_comment(line, depth, quote)
            if stripped.endswith("\\") and quote != "'":  # a continuation, also inside double quotes
                buf += stripped[:-1] + " "
                continue
            buf += stripped
            if quote is not None or depth > 0:
                buf += "\n" if quote is not None else " "
                continue
            if buf.strip():
                yield start, buf.strip()
            buf = ""
        if buf.strip():
            yield start, buf.strip()

    @staticmethod
    def _strip_comment(line: str, depth: int, quote: str | None) -> tuple[str, int, str | None]:
        out, i = [], 0
        while i < len(line):
            c = line[i]
            if quote:
                if c == quote:
                    quote = None
                elif c == "\\" and quote == '"' and i + 1 < len(line):
                    out.append(c)
                    i += 1
                    c = line[i]
            elif c in "'\"":
                quote = c
            elif c == "\\" and i + 1 < len(line):
                out.append(c)
                i += 1
                c = line[i]
            elif c == "#" and (i == 0 or line[i - 1] in " \t;"):
                break
            elif c == "(":
                depth += 1
            elif c == ")":
                depth = max(0, depth - 1)
            out.append(c)
            i += 1
        return "".join(out).rstrip(), depth, quote

    # ------------------------------------------------------------------ words

    def split(self, text: str) -> list[list[str]]:
        """Words of ``text`` split into simple commands at ; && || | & (expansions done)."""
        commands, words, word, has_word = [], [], [], False
        i = 0
        while i < len(text):
            c = text[i]
            if c in " \t\n":
                if has_word:
                    words.extend(self._finish(word))
                    word, has_word = [], False
                i += 1
                continue
            op = next((o for o in _OPERATORS if text.startswith(o, i)), None)
            if op is not None and not (op == "&" and text[i - 1 : i] == ">"):  # 2>&1 is not an operator
                if has_word:
                    words.extend(self._finish(word))
                    word, has_word = [], False
                commands.append(words)
                words = []
                i += len(op)
                continue
            has_word = True
            if c == "'":
                end = text.find("'", i + 1)
                end = len(text) if end < 0 else end
                word.append(("q", text[i + 1 : end]))
                i = end + 1
            elif c == '"':
                j, chunk = i + 1, []
                while j < len(text) and text[j] != '"':
                    if text[j] == "\\" and j + 1 < len(text) and text[j + 1] in '"\\$`':
                        chunk.append(text[j + 1])
                        j += 2
                    elif text[j] == "$":
                        value, j = self._expand_at(text, j)
                        if isinstance(value, list):  # "${ARR[@]}": one word per element
                            word.append(("q", "".join(chunk)))
                            word.append(("a", value))
                            chunk = []
                        else:
                            chunk.append(value)
                    else:
                        chunk.append(text[j])
                        j += 1
                word.append(("q", "".join(chunk)))
                i = j + 1
            elif c == "$":
                value, i = self._expand_at(text, i)
                word.append(("u", value))
            elif c == "`":
                end = text.find("`", i + 1)
                end = len(text) if end < 0 else end
                word.append(("q", self._substitute(text[i + 1 : end])))
                i = end + 1
            elif c == "\\" and i + 1 < len(text):
                word.append(("q", text[i + 1]))
                i += 2
            else:
                word.append(("q", c))
                i += 1
        if has_word:
            words.extend(self._finish(word))
        commands.append(words)
        return [c for c in commands if c]

    @staticmethod
    def _finish(parts: list[tuple[str, object]]) -> list[str]:
        """Join the parts of one word; an unquoted expansion is split on blanks (an array into its words)."""
        out, current, touched = [], "", False
        has_array = any(kind == "a" for kind, _ in parts)
        for kind, value in parts:
            if kind == "q":
                current += value
                touched = touched or bool(value) or not has_array  # "$@" alone gives no word
                continue
            pieces = list(value) if kind == "a" or isinstance(value, list) else str(value).split()
            if not pieces:
                continue
            current += pieces[0]
            touched = True
            for piece in pieces[1:]:
                out.append(current)
                current = piece
        if touched:
            out.append(current)
        return out

    def _expand_at(self, text: str, i: int) -> tuple[object, int]:
        """The expansion starting at text[i] == '$' and the index after it."""
        if text.startswith("$((", i):
            end = self._matching(text, i + 1)
            return self._arithmetic(text[i + 3 : end - 1]), end + 1
        if text.startswith("$(", i):
            end = self._matching(text, i + 1)
            return self._substitute(text[i + 2 : end]), end + 1
        if text.startswith("${", i):
            end = text.find("}", i)
            depth = 1
            j = i + 2
            while j < len(text) and depth:  # nested ${a:-${b}}
                if text.startswith("${", j):
                    depth += 1
                    j += 2
                    continue
                if text[j] == "}":
                    depth -= 1
                j += 1
            end = j - 1
            return self._parameter(text[i + 2 : end]), end + 1
        m = re.match(rf"\$({_NAME}|[0-9@*#?$!])", text[i:])
        if not m:
            return "$", i + 1
        return self._variable(m.group(1)), i + len(m.group(0))

    @staticmethod
    def _matching(text: str, open_index: int) -> int:
        depth = 0
        for j in range(open_index, len(text)):
            if text[j] == "(":
                depth += 1
            elif text[j] == ")":
                depth -= 1
                if depth == 0:
                    return j
        return len(text) - 1

    def _variable(self, name: str) -> object:
        if name in ("@", "*", "#") or name.isdigit():
            return [] if name in ("@", "*") else ""
        if name in self.env:
            return self.env[name]
        return UNSET + name

    def _parameter(self, body: str) -> object:
        if body[:1] in ("@", "*"):  # ${@:1}, ${*}: the script's arguments (none)
            return []
        m = re.match(rf"^({_NAME})\[[@*]\]$", body)
        if m:
            value = self.env.get(m.group(1), [])
            return value if isinstance(value, list) else [value]
        m = re.match(rf"^#{_NAME}", body)
        if m:
            return "0"
        m = re.match(rf"^({_NAME})(//?)([^/]*)/(.*)$", body, re.S)  # ${NAME//pattern/replacement}
        if m:
            name, slashes, pattern, replacement = m.groups()
            value = self.env.get(name)
            if value is None or isinstance(value, list):
                return self._variable(name)
            return str(value).replace(pattern, replacement, -1 if slashes == "//" else 1)
        m = re.match(rf"^({_NAME}|[0-9]+)(:?[-=+?])(.*)$", body, re.S)
        if m:
            name, op, default = m.groups()
            value = self.env.get(name) if not name.isdigit() else None
            empty = value is None or (op.startswith(":") and value in ("", []))
            if op.endswith("+"):
                return "" if empty else self._expand_text(default)
            if empty:
                value = self._expand_text(default)
                if op.endswith("=") and not name.isdigit():
                    self.env[name] = value
            return value
        m = re.match(rf"^({_NAME})", body)
        return self._variable(m.group(1)) if m else ""

    def _expand_text(self, text: str) -> str:
        words = self.split(text) if text else []
        return " ".join(w for command in words for w in command)

    def _substitute(self, command: str) -> str:
        """A command substitution: the script's directory for the usual ``cd $(dirname $0) && pwd``
        idioms, the working directory for a bare ``pwd``; otherwise a marker."""
        if re.search(r"\bdirname\b|realpath|readlink|BASH_SOURCE", command):
            return self.script_dir
        if command.strip() == "pwd":
            return self.cwd
        name = re.sub(r"[^A-Za-z0-9]+", "_", command.strip().split(" ")[0])[:20] or "CMD"
        return UNSET + "CMD_" + name

    def _arithmetic(self, expr: str) -> str:
        expanded = re.sub(rf"\$?\{{?({_NAME})\}}?", lambda m: str(self.env.get(m.group(1), "x")), expr)
        if re.fullmatch(r"[0-9+\-*/%() ]+", expanded):
            try:
                return str(int(eval(expanded.replace("/", "//"), {"__builtins__": {}})))  # digits and operators only
            except (ArithmeticError, SyntaxError):
                pass
        return UNSET + "ARITH"

    # ------------------------------------------------------------------ commands

    def commands(self) -> Iterator[Command]:
        """Every simple command of the script, in order, with the assignments before it applied.
        ``if``/``elif``/``else`` follow the branch whose condition holds when the condition is a
        string test on known values (``[[ $a == b ]]``, ``-z``, ``-n``); otherwise the first branch."""
        frames: list[list[bool]] = []  # per open if: [this branch active, a branch already taken]
        for command in self._commands():
            words = list(command.words)
            head = words[0]
            if head in ("if", "elif"):
                condition = self._condition(words[1:])
                if head == "if":
                    active = condition is not False
                    frames.append([active, active])
                elif frames:
                    active = not frames[-1][1] and condition is not False
                    frames[-1] = [active, frames[-1][1] or active]
                continue
            if head == "else" and frames:
                frames[-1] = [not frames[-1][1], True]
                words = words[1:]
            elif head == "fi" and frames:
                frames.pop()
                continue
            if words and words[0] == "then":
                words = words[1:]
            if not all(frame[0] for frame in frames) or not words:
                continue
            words = self._assign_prefix(words)
            if words:
                yield Command(words, command.line)

    @staticmethod
    def _condition(words: list[str]) -> bool | None:
        """A ``[[ ... ]]`` / ``[ ... ]`` string test on expanded words, or None when it is anything else."""
        words = [w for w in words if w not in ("[[", "]]", "[", "]", "then")]
        if any(UNSET in w for w in words):
            return None
        if len(words) == 3 and words[1] in ("==", "=", "!="):
            return (words[0] == words[2]) == (words[1] != "!=")
        if len(words) == 2 and words[0] in ("-z", "-n"):
            return (words[1] == "") == (words[0] == "-z")
        if len(words) == 1 and words[0] in ("-z", "-n"):  # [[ -z $EMPTY ]]
            return words[0] == "-z"
        return None

    def _commands(self) -> Iterator[Command]:
        """Every simple command with its words expanded (assignments are not applied here)."""
        for line, text in self._logical_lines():
            array = re.match(rf"^(?:export\s+|local\s+|declare\s+-a\s+)?({_NAME})(\+?)=\((.*)\)\s*$", text, re.S)
            if array:
                name, append, inner = array.groups()
                items = [w for command in self.split(inner) for w in command]
                old = self.env.get(name, [])
                self.env[name] = (old if isinstance(old, list) and append else []) + items
                continue
            for words in self.split(text):
                yield Command(words, line)

    def _assign_prefix(self, words: list[str]) -> list[str]:
        """Record leading ``NAME=value`` words (a bare assignment, or an environment prefix of a
        command); return the rest of the command."""
        while words:
            head = words[0]
            if head in ("export", "local", "readonly", "declare") and len(words) > 1:
                words = words[1:]
                continue
            m = _ASSIGN.match(head)
            if not m:
                return words
            name, append, value = m.groups()
            if value.startswith("(") and value.rstrip().endswith(")"):
                items = [w for command in self.split(value.strip()[1:-1]) for w in command]
                self.env[name] = (self.env.get(name, []) if append else []) + items  # type: ignore[operator]
            else:
                self.env[name] = (str(self.env.get(name, "")) if append else "") + value
            words = words[1:]
        return words


def read_script(path: str | Path, cwd: str | Path | None = None) -> ShellReader:
    path = Path(path)
    return ShellReader(
        path.read_text(errors="replace"),
        script_dir=str(path.parent.resolve()),
        cwd=str(Path(cwd or path.parent).resolve()),
    )
