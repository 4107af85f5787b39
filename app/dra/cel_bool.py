"""The boolean structure of a CEL expression: ``&&``, ``||``, ``!`` and parentheses over opaque
atoms (docs/dra.md, "What is read from selectors"). Pure.

Not a CEL engine: a strict tokenizer (string literals with either quote, raw strings, escapes,
brackets) and a recursive-descent parser of the logical operators. Everything between them (a
comparison, a function call) is an ``Atom`` holding its source text, which the selector reader
matches against the forms it understands. An expression this parser does not accept (a token it
does not know, unbalanced brackets, a ternary at the top, nesting deeper than ``MAX_DEPTH``) is
``None``: its reader then reads nothing from it, which only widens the devices it accepts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

MAX_DEPTH = 32  # parentheses and negations nested deeper are not read (and cost no recursion)
MAX_TOKENS = 2048


@dataclass(frozen=True, slots=True)
class Atom:
    """A part with no top-level logical operator, as written (whitespace collapsed)."""

    text: str


@dataclass(frozen=True, slots=True)
class Not:
    arg: Node


@dataclass(frozen=True, slots=True)
class And:
    args: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Or:
    args: tuple[Node, ...]


Node = Atom | Not | And | Or

# One token: a string literal (optionally raw/bytes-prefixed; triple quotes are not accepted), a
# two-character operator, a number, an identifier, one punctuation character.
_TOKEN = re.compile(r"""
    \s+
  | (?P<str>[rRbB]{0,2}(?:"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'))
  | (?P<op>&&|\|\||==|!=|<=|>=)
  | (?P<num>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[uU]?)
  | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>[()\[\]{}.,!<>+\-*/%?:])
""", re.VERBOSE)


class _Refused(Exception):
    """The expression is not one this parser reads."""


def _tokens(expr: str) -> list[tuple[str, int, int]]:
    """(token, start, end); raises ``_Refused`` on anything the grammar does not know."""
    out: list[tuple[str, int, int]] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None or (m.group("str") and expr[m.start():m.start() + 3] in ('"""', "'''")):
            raise _Refused
        if m.lastgroup is not None:
            out.append((m.group(), m.start(), m.end()))
            if len(out) > MAX_TOKENS:
                raise _Refused
        pos = m.end()
    return out


class _Parser:
    def __init__(self, expr: str) -> None:
        self.expr = expr
        self.toks = _tokens(expr)
        self.i = 0
        # Parentheses holding a ternary (``(a ? b : c)``): an atom as a whole, never split.
        self.ternary: set[int] = set()
        stack: list[int] = []
        for i, (tok, _, _) in enumerate(self.toks):
            if tok in ("(", "[", "{"):
                stack.append(i)
            elif tok in (")", "]", "}") and stack:
                stack.pop()
            elif tok == "?" and stack and self.toks[stack[-1]][0] == "(":
                self.ternary.add(stack[-1])

    def peek(self) -> str | None:
        return self.toks[self.i][0] if self.i < len(self.toks) else None

    def parse(self) -> Node:
        node = self.disjunction(0)
        if self.i != len(self.toks):
            raise _Refused  # a stray ")" or a ternary's "?" at the top
        return node

    def disjunction(self, depth: int) -> Node:
        args = [self.conjunction(depth)]
        while self.peek() == "||":
            self.i += 1
            args.append(self.conjunction(depth))
        return args[0] if len(args) == 1 else Or(tuple(args))

    def conjunction(self, depth: int) -> Node:
        args = [self.unary(depth)]
        while self.peek() == "&&":
            self.i += 1
            args.append(self.unary(depth))
        return args[0] if len(args) == 1 else And(tuple(args))

    def unary(self, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise _Refused
        start = self.i
        if self.peek() == "!":
            self.i += 1
            arg = self.unary(depth + 1)
            if self._ends_here():
                return Not(arg)
            self.i = start  # ``!x == y`` compares a negation: an atom as a whole
        elif self.peek() == "(" and self.i not in self.ternary:
            self.i += 1
            inner = self.disjunction(depth + 1)
            if self.peek() != ")":
                raise _Refused
            self.i += 1
            if self._ends_here():
                return inner
            self.i = start  # ``(a).b == c``: the parentheses are part of an atom
        return self.atom()

    def _ends_here(self) -> bool:
        return self.peek() in (None, "&&", "||", ")")

    def atom(self) -> Atom:
        """Tokens up to the next top-level ``&&``, ``||`` or closing parenthesis."""
        first = self.i
        stack: list[str] = []
        pairs = {")": "(", "]": "[", "}": "{"}
        while (tok := self.peek()) is not None:
            if not stack and tok in ("&&", "||", ")"):
                break
            if tok in ("(", "[", "{"):
                stack.append(tok)
            elif tok in pairs:
                if not stack or stack.pop() != pairs[tok]:
                    raise _Refused
            elif tok in ("?", ":") and not stack:
                raise _Refused  # a ternary is not read
            self.i += 1
        if stack or self.i == first:
            raise _Refused
        text = self.expr[self.toks[first][1]:self.toks[self.i - 1][2]]
        return Atom(" ".join(text.split()))


@lru_cache(maxsize=4096)  # the same classes' and claims' selectors are read on every filter call
def parse(expr: str) -> Node | None:
    """The logical structure of ``expr``, or None when this parser does not read it."""
    try:
        return _Parser(expr).parse()
    except _Refused:
        return None


def conjuncts(node: Node) -> list[Node]:
    """The parts joined by top-level ``&&`` (nested conjunctions flattened)."""
    if isinstance(node, And):
        return [c for a in node.args for c in conjuncts(a)]
    return [node]


def possible(node: Node, value_of: dict[str, bool | None]) -> bool | None:
    """Kleene's three-valued evaluation: True/False where the atoms in ``value_of`` decide it, None
    (unknown) where an atom not in it matters."""
    if isinstance(node, Atom):
        return value_of.get(node.text)
    if isinstance(node, Not):
        got = possible(node.arg, value_of)
        return None if got is None else not got
    vals = [possible(a, value_of) for a in node.args]
    if isinstance(node, And):
        return False if False in vals else None if None in vals else True
    return True if True in vals else None if None in vals else False


def atoms(node: Node) -> list[str]:
    if isinstance(node, Atom):
        return [node.text]
    if isinstance(node, Not):
        return atoms(node.arg)
    return [t for a in node.args for t in atoms(a)]
