"""Node features and Slurm's `--constraint` expressions over them (pure).

A node's features are the ones its cluster YAML or executor gives it plus its GPU model in lower case (`h100`).
A constraint is Slurm's feature expression: a feature, `a&b` (both), `a|b` (either), parentheses, and the
matching OR `[a|b]` (every node of the job has the same one of them). `&` binds tighter than `|`. Features are
compared in lower case. Node counts (`a*2`), `!` and brackets inside a larger expression are refused by name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_FEATURE = re.compile(r"[A-Za-z0-9_.:=+/-]+")


class ConstraintError(ValueError):
    """A `--constraint` expression this scheduler cannot read."""


@dataclass(frozen=True)
class FeatureConstraint:
    """A constraint in disjunctive normal form: a node qualifies when it has every feature of one `any_of` term.

    `matching` (Slurm's `[a|b]`): all nodes of one job must qualify through the same term.
    """

    text: str
    any_of: tuple[frozenset[str], ...]
    matching: bool = False

    def allows(self, features: Iterable[str]) -> bool:
        have = {f.lower() for f in features}
        return any(term <= have for term in self.any_of)

    def alternatives(self) -> tuple[FeatureConstraint, ...]:
        """For a matching OR, one plain constraint per term; else itself."""
        if not self.matching or len(self.any_of) == 1:
            return (self,)
        return tuple(FeatureConstraint("&".join(sorted(t)), (t,)) for t in self.any_of)


def parse_constraint(text: str) -> FeatureConstraint:
    """Read a Slurm feature expression; `ConstraintError` names what is not supported."""
    src = text.strip()
    if not src:
        raise ConstraintError("empty constraint")
    matching = False
    if src.startswith("[") and src.endswith("]") and src.count("[") == 1 and src.count("]") == 1:
        matching, src = True, src[1:-1].strip()
    parser = _Parser(src, text)
    dnf = parser.expr()
    if parser.pos < len(parser.tokens):
        parser.fail(f"unexpected {parser.tokens[parser.pos]!r}")
    terms = tuple(sorted(set(dnf), key=lambda t: sorted(t)))
    return FeatureConstraint(text.strip(), terms, matching)


class _Parser:
    def __init__(self, src: str, original: str) -> None:
        self.original = original
        self.tokens = self._lex(src)
        self.pos = 0

    def fail(self, why: str) -> None:
        raise ConstraintError(f"constraint {self.original!r}: {why}")

    def _lex(self, src: str) -> list[str]:
        tokens: list[str] = []
        i = 0
        while i < len(src):
            c = src[i]
            if c.isspace():
                i += 1
            elif c in "&|()":
                tokens.append(c)
                i += 1
            elif c == ",":
                tokens.append("&")  # Slurm reads a comma as AND in older scripts
                i += 1
            elif c == "*":
                self.fail("node counts (feature*N) are not supported")
            elif c == "!":
                self.fail("'!' (not) is not supported")
            elif c in "[]":
                self.fail("the matching OR [a|b] must be the whole expression")
            else:
                m = _FEATURE.match(src, i)
                if m is None:
                    self.fail(f"unexpected character {c!r}")
                assert m is not None
                tokens.append(m.group(0).lower())
                i = m.end()
        return tokens

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def expr(self) -> list[frozenset[str]]:
        terms = self.term()
        while self.peek() == "|":
            self.pos += 1
            terms = terms + self.term()
        return terms

    def term(self) -> list[frozenset[str]]:
        terms = self.factor()
        while self.peek() == "&":
            self.pos += 1
            right = self.factor()
            terms = [a | b for a in terms for b in right]
            if len(terms) > 64:
                self.fail("too many combinations; simplify the expression")
        return terms

    def factor(self) -> list[frozenset[str]]:
        tok = self.peek()
        if tok is None:
            self.fail("ends where a feature was expected")
        assert tok is not None
        if tok == "(":
            self.pos += 1
            inner = self.expr()
            if self.peek() != ")":
                self.fail("missing ')'")
            self.pos += 1
            return inner
        if tok in ("&", "|", ")"):
            self.fail(f"expected a feature, found {tok!r}")
        self.pos += 1
        return [frozenset({tok})]


def model_feature(gpu_model: str | None) -> str | None:
    """The feature a GPU model gives its node: `H100` → `h100`, `RTX 5090` → `rtx-5090`; None when unknown."""
    if not gpu_model or gpu_model.strip().lower() in ("", "unknown"):
        return None
    return re.sub(r"\s+", "-", gpu_model.strip().lower())


def node_features(gpu_model: str | None, features: Iterable[str] = ()) -> frozenset[str]:
    """A node's features as constraints see them: its own (lower case) and its GPU model's."""
    out = {f.strip().lower() for f in features if f.strip()}
    model = model_feature(gpu_model)
    if model:
        out.add(model)
    return frozenset(out)
