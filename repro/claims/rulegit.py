"""The repository's history as the rules' history reads it (:mod:`repro.claims.rulehistory`):
where claims' rules live (:data:`CLAIMS_PATH`, :data:`VERDICT_MODULES`) and :class:`Git`, one
repository's trees and blobs read through one ``git cat-file`` process (:data:`WORKTREE`: the
working tree, read as if it were a commit)."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
from pathlib import Path


CLAIMS_PATH = "repro/data/claims.yaml"
# an entry's keys that are not its rule: its statement and notebook; ``ledger``, the recorded
# cells where the rule's config is found (repro.claims.ledger_set), which the rule itself states;
# ``kind`` (a projection)
NOT_RULE = ("claim", "notebook", "first_registered", "ledger", "kind")
#: where verdict functions and their helpers live, as path patterns
VERDICT_MODULES = (re.compile(r"repro/claims/verdicts(/[^/]+)?\.py$"),
                   re.compile(r"repro/verdicts?\.py$"),
                   re.compile(r"repro/experiments/[^/]+/rules\.py$"))
#: a function that decides a claim: ``a8`` or ``a8_verdict``
DEF_VERDICT = re.compile(rb"^def ([ab]\d+)(_verdict)?\(", re.M)
#: what a verdict function reaches that is no part of its rule: the record it returns
NOT_CODE = frozenset({"Verdict"})
#: the working tree, read as if it were a commit (a rule changed but not yet committed)
WORKTREE = "WORKTREE"


def _parse(text: str | None) -> ast.Module | None:
    if text is None:
        return None
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


class Git:
    """Reads one repository's history: trees and blobs through one ``git cat-file`` process,
    each blob parsed once."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._cat: subprocess.Popen | None = None
        self._blobs: dict[str, bytes] = {}
        self._trees: dict[str, ast.Module | None] = {}

    def run(self, *args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=self.root, capture_output=True,
                                 text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout if out.returncode == 0 else None

    def blob(self, sha: str) -> bytes:
        if sha.startswith(WORKTREE + ":"):  # a file of the working tree, read as it is now
            return (self.root / sha.split(":", 1)[1]).read_bytes()
        if sha not in self._blobs:
            if self._cat is None:
                self._cat = subprocess.Popen(["git", "cat-file", "--batch"], cwd=self.root,
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self._cat.stdin.write(sha.encode() + b"\n")
            self._cat.stdin.flush()
            header = self._cat.stdout.readline().split()
            if len(header) < 3 or header[1] != b"blob":
                raise ValueError(f"git: {sha} is not a blob in {self.root}")
            data = self._cat.stdout.read(int(header[2]))
            self._cat.stdout.readline()
            self._blobs[sha] = data
        return self._blobs[sha]

    def tree(self, commit: str) -> dict[str, str]:
        """{path: blob sha} of the files under repro/ and notebooks/ at ``commit``
        (:data:`WORKTREE`: the working tree's, tracked or not ignored, each read anew)."""
        if commit == WORKTREE:
            out = self.run("ls-files", "--cached", "--others", "--exclude-standard", "--",
                           "repro", "notebooks") or ""
            return {p: f"{WORKTREE}:{p}" for p in out.splitlines() if (self.root / p).is_file()}
        return self._tree(commit)

    @functools.lru_cache(maxsize=None)
    def _tree(self, commit: str) -> dict[str, str]:
        out = self.run("ls-tree", "-r", commit, "--", "repro", "notebooks") or ""
        files = {}
        for line in out.splitlines():
            meta, path = line.split("\t", 1)
            if meta.split()[1] == "blob":
                files[path] = meta.split()[2]
        return files

    def text(self, commit: str, path: str) -> str | None:
        sha = self.tree(commit).get(path)
        return self.blob(sha).decode("utf-8", "replace") if sha else None

    def parsed(self, commit: str, path: str) -> ast.Module | None:
        """The syntax tree of ``path`` at ``commit`` (None where it is missing or does not
        parse), each blob parsed once."""
        sha = self.tree(commit).get(path)
        if sha is None:
            return None
        if sha not in self._trees:  # (a working-tree file: as it was when first read)
            self._trees[sha] = _parse(self.blob(sha).decode("utf-8", "replace"))
        return self._trees[sha]

    @functools.lru_cache(maxsize=None)
    def commits(self) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
        """(commit, committer date, parents) of every commit of HEAD that touched repro/ or
        notebooks/, oldest first; parents as rewritten to such commits."""
        out = self.run("log", "--reverse", "--topo-order", "--parents", "--format=%H|%cI|%P",
                       "HEAD", "--", "repro", "notebooks") or ""
        rows = []
        for line in out.splitlines():
            commit, date, parents = line.split("|")
            rows.append((commit, date, tuple(parents.split())))
        return tuple(rows)

    def date(self, commit: str) -> str:
        return (self.run("show", "-s", "--format=%cI", commit) or "").strip()

    def close(self):
        if self._cat is not None:
            self._cat.stdin.close()
            self._cat.wait()
            self._cat = None


def available(root: Path | str) -> bool:
    """Whether ``root`` is a git checkout with its whole history (not a shallow clone)."""
    out = Git(root).run("rev-parse", "--is-shallow-repository")
    return out is not None and out.strip() == "false"
