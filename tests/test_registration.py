"""Pre-registration checked from git (repro.claims.registration): a small repository where a
claim's rule changes after its first record; the verdict then shows both rules' verdicts."""

import subprocess

import pandas as pd
import yaml

from repro.claims import registration as R
from repro.claims.verdicts import Verdict


def git(root, *args, date=None):
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(root), "PATH": "/usr/bin:/bin"}
    if date:
        env |= {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    return subprocess.run(["git", *args], cwd=root, env=env, check=True,
                          capture_output=True, text=True).stdout


def x1(table, rule=None):
    """A toy verdict: reproduced when the ratio reaches the rule's target."""
    got = float(table["ratio"].max())
    return Verdict("X1", "reproduced" if got >= rule["target"] else "contradicted",
                   f"{got:.2f}x (target {rule['target']}x)")


def claims(target):
    return {"X1": {"claim": "X is up to 1.5x faster", "notebook": "nb",
                   "rule": {"studies": ["xs"], "statistic": "ratio", "combine": "one",
                            "target": target}}}


def repo(tmp_path, change_after_record: bool):
    root = tmp_path / "repo"
    (root / "repro/data").mkdir(parents=True)
    (root / "repro/claims/verdicts").mkdir(parents=True)
    git(root, "init", "-q")
    (root / "repro/claims/verdicts/x.py").write_text(
        "def x1(table, rule=None):\n    return rule['target']\n")
    (root / "repro/data/claims.yaml").write_text(yaml.safe_dump(claims(1.2)))
    git(root, "add", "-A")
    git(root, "commit", "-qm", "rule", date="2026-01-01T00:00:00+00:00")
    if change_after_record:
        (root / "repro/data/claims.yaml").write_text(yaml.safe_dump(claims(1.5)))
        git(root, "commit", "-qam", "rule changed", date="2026-01-03T00:00:00+00:00")
    return root


RECORDS = pd.DataFrame({"timestamp": ["2026-01-02T00:00:00+00:00"], "git_commit": ["c"]})
TABLE = pd.DataFrame({"ratio": [1.3]})


def test_a_rule_changed_after_its_first_record_shows_the_verdict_under_both_rules(tmp_path):
    root = repo(tmp_path, change_after_record=True)
    c = yaml.safe_load((root / "repro/data/claims.yaml").read_text())
    check = R.check("X1", RECORDS, root, c)
    assert check["preregistered"] is False
    assert check["rule_registered"]["date"].startswith("2026-01-03")
    assert check["first_record"]["date"].startswith("2026-01-02")
    v = R.judged(x1, "X1", TABLE, records=RECORDS, root=root, claims=c)
    assert v.verdict == "contradicted"  # the current rule: 1.30x < 1.5x
    assert "rule changed on 2026-01-03, after the first record of 2026-01-02" in v.key_number
    assert "under the rule as first registered" in v.key_number
    assert "reproduced, 1.30x (target 1.2x)" in v.key_number  # the rule before the data
    assert v.numbers["registration"] == {"preregistered": 0,
                                        "first_rule_verdict": "reproduced"}
    assert v.caveat == "rule changed after its data: reproduced under the rule first registered"


def test_a_rule_registered_before_its_data_is_said_to_be(tmp_path):
    root = repo(tmp_path, change_after_record=False)
    c = yaml.safe_load((root / "repro/data/claims.yaml").read_text())
    assert R.check("X1", RECORDS, root, c)["preregistered"] is True
    v = R.judged(x1, "X1", TABLE, records=RECORDS, root=root, claims=c)
    assert v.verdict == "reproduced" and v.key_number == "1.30x (target 1.2x)"


def test_an_explicit_first_registered_rule_is_used_and_a_restatement_is_no_change(tmp_path):
    root = repo(tmp_path, change_after_record=True)
    c = yaml.safe_load((root / "repro/data/claims.yaml").read_text())
    first = git(root, "rev-list", "--max-parents=0", "HEAD").strip()[:7]
    c["X1"]["first_registered"] = {"commit": first, "rule": {**c["X1"]["rule"], "target": 1.0}}
    v = R.judged(x1, "X1", TABLE, records=RECORDS, root=root, claims=c)
    assert f"under the rule as first registered ({first}, 2026-01-01): reproduced, 1.30x " \
           "(target 1.0x)" in v.key_number
    # the change listed as a restatement does not count: the rule is then the first one's
    head = git(root, "rev-parse", "HEAD").strip()
    (root / "repro/data/rule_restatements.yaml").write_text(f"{head[:7]}: test\n")
    assert R.check("X1", RECORDS, root, c)["preregistered"] is True


def test_without_history_registration_is_not_checked(tmp_path):
    root = repo(tmp_path, change_after_record=True)
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{root}", str(shallow))
    c = yaml.safe_load((shallow / "repro/data/claims.yaml").read_text())
    check = R.check("X1", RECORDS, shallow, c)
    assert check["preregistered"] == "unknown" and check["rule_registered"] is None
    v = R.judged(x1, "X1", TABLE, records=RECORDS, root=shallow, claims=c)
    assert v.key_number.endswith("; registration not checked (no git history)")


def test_a_rule_changed_on_a_merged_branch_is_registered_when_the_branch_changed_it(tmp_path):
    root = repo(tmp_path, change_after_record=False)
    git(root, "checkout", "-qb", "side")
    (root / "repro/data/claims.yaml").write_text(yaml.safe_dump(claims(1.5)))
    git(root, "commit", "-qam", "rule changed on a branch", date="2026-01-03T00:00:00+00:00")
    changed = git(root, "rev-parse", "--short=7", "HEAD").strip()
    git(root, "checkout", "-q", "-")
    (root / "notes.txt").write_text("unrelated\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "unrelated", date="2026-01-04T00:00:00+00:00")
    git(root, "merge", "-q", "--no-ff", "--no-edit", "side", date="2026-01-05T00:00:00+00:00")
    reg = R.registered("X1", root)
    assert reg == {"commit": changed, "date": "2026-01-03T00:00:00+00:00"}


def test_a_rule_naming_its_data_files_is_judged_by_their_first_commit(tmp_path):
    """A claim about one hardware and recipe (C1, C2) names its record files (``data``):
    older records of its studies (other recipes, other hardware) are not its data, so a rule
    registered after them but before its own files is preregistered; a rule without
    ``data`` counts every record of its studies."""
    root = tmp_path / "repo"
    (root / "repro/data").mkdir(parents=True)
    (root / "results/h200/xs").mkdir(parents=True)
    git(root, "init", "-q")
    (root / "results/h200/xs/bf16.json").write_text("[]")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "old records", date="2026-01-01T00:00:00+00:00")
    c = claims(1.2)
    c["X1"]["rule"]["data"] = ["results/tpu/xs/*int8*"]
    (root / "repro/data/claims.yaml").write_text(yaml.safe_dump(c))
    git(root, "add", "-A")
    git(root, "commit", "-qm", "rule", date="2026-01-02T00:00:00+00:00")
    assert R.check("X1", None, root, c)["first_record"] is None  # none of its files yet
    (root / "results/tpu/xs").mkdir(parents=True)
    (root / "results/tpu/xs/w4096_int8.json").write_text("[]")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "int8 records", date="2026-01-03T00:00:00+00:00")
    check = R.check("X1", None, root, c)
    assert check["preregistered"] is True
    assert check["first_record"]["committed_from"].startswith("2026-01-03")
    del c["X1"]["rule"]["data"]  # every record of the study: the old one came first
    assert R.check("X1", None, root, c)["preregistered"] is False
