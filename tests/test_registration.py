"""Registration from the history (repro.claims.rulehistory, repro.claims.registration).

Small repositories first: a rule changed after its first record is found and its first rule's
verdict shown; a refactor is proven a restatement; a helper's change counts; a notebook's own
verdict code is a rule; a shallow clone reads the same findings. Then this repository: the
committed findings are what its history says, every change after the data is proven on the
committed inputs, the first rules' verdicts (A8 contradicted, B1 changed by 3cc04ba), and a rule
changed in the working tree is caught.
"""

import json
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from repro.claims import registration as R
from repro.claims import rulecode, ruleinputs
from repro.claims import rulehistory as H
from repro.claims.verdicts import Verdict
from repro.verdict import definitions


def git(root, *args, date=None):
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(root), "PATH": "/usr/bin:/bin"}
    if date:
        env |= {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    return subprocess.run(["git", *args], cwd=root, env=env, check=True,
                          capture_output=True, text=True).stdout


# a verdict module of a small repository: a1 judges the best ratio against the rule's target
RULE = '''from repro.verdict import Verdict

def _best(table):
    return float(table["ratio"].max())

def a1(table, rule=None):
    """reproduced at the target"""
    got = _best(table)
    return Verdict("A1", "reproduced" if got >= rule["target"] else "contradicted",
                   f"{got:.2f}x (target {rule['target']}x)")
'''
CLAIMS = {"A1": {"claim": "X is up to 1.5x faster", "notebook": "nb",
                 "rule": {"studies": ["xs"], "statistic": "ratio", "target": 1.2}}}
TABLE = pd.DataFrame({"ratio": [1.3, 1.1]})


def commit(root, message, date, files):
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    git(root, "add", "-A")
    git(root, "commit", "-qm", message, date=date)
    return git(root, "rev-parse", "--short=7", "HEAD").strip()


def small_repo(tmp_path, later: dict[str, str]):
    """A rule (2026-01-01), its first record (2026-01-02), then ``later`` commits, one a day:
    {message: the verdict module's new text}. Returns (root, {message: commit})."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    made = {"rule": commit(root, "rule", "2026-01-01T00:00:00+00:00", {
        "repro/data/claims.yaml": yaml.safe_dump(CLAIMS),
        "repro/claims/verdicts/x.py": RULE})}
    made["record"] = commit(root, "record", "2026-01-02T00:00:00+00:00", {
        "results/h/xs/c.json": json.dumps([{"timestamp": "2026-01-02T00:00:00+00:00"}]),
        "verdicts/inputs/A1.json": ruleinputs.dump((TABLE,), {})})
    for day, (message, text) in enumerate(later.items(), start=3):
        made[message] = commit(root, message, f"2026-01-{day:02d}T00:00:00+00:00",
                               {"repro/claims/verdicts/x.py": text})
    return root, made


def findings(root):
    return H.build(root, examples=30, records_of=lambda studies: None)


def test_a_change_after_the_data_is_found_and_a_refactor_is_proven_a_restatement(tmp_path):
    helper = RULE.replace('table["ratio"].max()', 'table["ratio"].min()')  # 1.1: contradicted
    refactor = helper.replace("got = _best(table)", "best = _best(table)\n    got = best")
    root, made = small_repo(tmp_path, {"helper": helper, "refactor": refactor})
    f = findings(root)["claims"]["A1"]
    assert f["first_rule"]["commit"] == made["rule"]
    assert f["rule_at_data"]["commit"] == made["rule"]
    assert f["first_data"]["date"].startswith("2026-01-02")
    decided = {c["commit"]: c["decides"] for c in f["changes"]}
    # the helper's change decides otherwise on today's table (min 1.1 < 1.2): a change
    assert decided == {made["helper"]: "differently", made["refactor"]: "the same"}
    assert f["changed"]["commit"] == made["helper"] and f["preregistered"] is False
    assert "reproduced before, contradicted after" in f["changes"][0]["how"]


def test_a_change_only_generated_tables_tell_apart_is_still_a_change(tmp_path):
    stricter = RULE.replace('got >= rule["target"]', 'got >= rule["target"] + 0.05')
    root, made = small_repo(tmp_path, {"stricter": stricter})
    f = findings(root)["claims"]["A1"]
    # today's 1.3 passes both 1.2 and 1.25: only a ratio between them tells the rules apart
    (c,) = f["changes"]
    assert c["decides"] == "differently" and "generated" in c["how"], c


def test_the_first_rules_verdict_is_shown_in_a_small_repository(tmp_path):
    helper = RULE.replace('table["ratio"].max()', 'table["ratio"].min()')
    root, made = small_repo(tmp_path, {"helper": helper})
    found = findings(root)
    ns: dict = {}
    exec(helper, ns)  # today's rule
    v = R.judged(ns["a1"], "A1", TABLE, claims=CLAIMS, found=found)
    assert v.verdict == "contradicted"
    said = (f"reproduced under its rule before the data ({made['rule']}, 2026-01-01); changed "
            f"by {made['helper']} (2026-01-03)")
    assert v.key_number.endswith(said) and v.caveat.startswith(said)
    assert v.numbers["registration"] == {"preregistered": 0, "changed": made["helper"],
                                        "first_rule_verdict": "reproduced"}
    # where the first rule agrees, only the mark: no text
    same = R.judged(ns["a1"], "A1", pd.DataFrame({"ratio": [1.0]}), claims=CLAIMS, found=found)
    assert same.key_number == "1.00x (target 1.2x)" and same.caveat == ""
    assert same.numbers["registration"]["preregistered"] == 0


def test_a_rule_written_before_its_data_and_never_changed_is_preregistered(tmp_path):
    root, made = small_repo(tmp_path, {"doc": RULE.replace('"""reproduced at the target"""',
                                                           '"""at the target, reproduced"""')})
    f = findings(root)["claims"]["A1"]
    assert f["changes"] == [] and f["preregistered"] is True  # a docstring is no change
    ns: dict = {}
    exec(RULE, ns)
    v = R.judged(ns["a1"], "A1", TABLE, claims=CLAIMS, found=findings(root))
    assert v.key_number == "1.30x (target 1.2x)" and v.numbers["registration"] == {
        "preregistered": 1}


NOTEBOOK = '''# %%
import pandas as pd

# %% [markdown]
# verdict

# %%
best = table["ratio"].max()


def a1_verdict(x):
    return "reproduced" if x >= 1.2 else "contradicted"


claims.write_verdict("A1", a1_verdict(best), f"{best:.2f}x")
'''


def test_a_notebooks_own_verdict_code_is_a_first_rule(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    first = commit(root, "notebook", "2026-01-01T00:00:00+00:00", {
        "repro/data/claims.yaml": yaml.safe_dump(CLAIMS), "notebooks/nb.py": NOTEBOOK})
    commit(root, "record", "2026-01-02T00:00:00+00:00", {
        "results/h/xs/c.json": json.dumps([{"timestamp": "2026-01-02T00:00:00+00:00"}]),
        "verdicts/inputs/A1.json": ruleinputs.dump((TABLE,), {})})
    moved = commit(root, "moved", "2026-01-03T00:00:00+00:00", {
        "repro/claims/verdicts/x.py": RULE,
        "notebooks/nb.py": NOTEBOOK.split("# %%\ndef")[0]
        + "# %%\nclaims.write_verdict(verdicts.a1(table, rule=None))\n"})
    monkeypatch.setitem(rulecode.NOTEBOOK_INPUTS, "notebooks/nb.py",
                        lambda claim, args, kw, records: {"table": args[0]})
    f = findings(root)["claims"]["A1"]
    assert f["first_rule"] == {"commit": first, "date": "2026-01-01T00:00:00+00:00",
                               "where": "notebooks/nb.py"}
    assert f["rule_at_data"]["where"] == "notebooks/nb.py"
    (c,) = f["changes"]  # the notebook's code became a function deciding the same
    assert c["commit"] == moved and c["decides"] == "the same", c
    assert f["preregistered"] is True


def test_a_verdict_function_a_loop_hands_on_is_the_rule_not_the_notebook(tmp_path):
    """A notebook that pairs each verdict function with its claim in a loop's tuples hands
    the verdict to the package's function: that function is the rule, not the notebook's
    loop (whose helpers read notebook variables the rule runner cannot name)."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    loop = ("# %%\nfrom repro.claims import verdicts\n\n# %%\n"
            "def judged_on(fn, claim):\n    return fn(nb.ledger(df, claim), rule=None)\n\n\n"
            'V = [judged_on(fn, claim) for fn, claim in ((verdicts.a1, "A1"),)]\n')
    made = commit(root, "loop", "2026-01-01T00:00:00+00:00", {
        "repro/data/claims.yaml": yaml.safe_dump(CLAIMS), "notebooks/nb.py": loop,
        "repro/claims/verdicts/x.py": RULE})
    v = H.version(H.Git(root), made, "A1")
    assert v.code is not None and (v.code.kind, v.code.entry) == ("function", "a1"), v.code
    # the same loop without the function in its tuples is the notebook's own code
    own = commit(root, "own", "2026-01-02T00:00:00+00:00", {"notebooks/nb.py": loop.replace(
        '((verdicts.a1, "A1"),)', '((None, "A1"),)')})
    assert H.version(H.Git(root), own, "A1").code.kind == "notebook"


def test_a_shallow_clone_cannot_build_findings_but_judges_as_the_full_one(tmp_path):
    helper = RULE.replace('table["ratio"].max()', 'table["ratio"].min()')
    root, made = small_repo(tmp_path, {"helper": helper})
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{root}", str(shallow))
    assert H.available(root) and not H.available(shallow)
    with pytest.raises(ValueError, match="whole git history"):
        H.build(shallow)
    found = findings(root)
    ns: dict = {}
    exec(helper, ns)
    v = R.judged(ns["a1"], "A1", TABLE, claims=CLAIMS, found=found)
    assert "reproduced under its rule before the data" in v.key_number  # no git needed


def test_inputs_round_trip_as_data():
    frame = pd.DataFrame({"x": ["a", "b"], "p": [0.5, float("nan")], "n": [1, 2],
                          "ok": [True, False], "d": [{"k": 1}, None]})
    args = (frame, {("a", 1): float("inf"), "b": (1, 2)}, pd.Series([1.0, 2.0], name="s"),
            pd.Timestamp("2026-01-01T00:00:00+00:00"), None)
    back, kw = ruleinputs.load(ruleinputs.dump(args, {"k": [1, 2.5]}))
    pd.testing.assert_frame_equal(back[0], frame)
    assert back[1] == {("a", 1): float("inf"), "b": (1, 2)} and kw == {"k": [1, 2.5]}
    pd.testing.assert_series_equal(back[2], args[2])
    assert back[3] == args[3] and back[4] is None
    ev = Verdict("A1", "partly", "1.5x")  # a dataclass comes back as its class
    assert ruleinputs.decode(ruleinputs.encode(ev)) == ev
    with pytest.raises(TypeError, match="cannot write a object"):
        ruleinputs.encode(object())


# ------------------------------------------------------------------------ this repository

CLAIM_IDS = list(definitions())


@pytest.fixture(autouse=True)
def scratch_verdicts(tmp_path, monkeypatch):
    """judged writes each verdict's inputs: into a scratch folder here, never verdicts/."""
    monkeypatch.setenv("REPRO_VERDICTS", str(tmp_path / "verdicts"))


@pytest.fixture(scope="module")
def history():
    """This repository's history: the registration findings need all of it."""
    from repro.results import repo_root

    root = repo_root()
    assert H.available(root), ("the registration tests need the whole git history: "
                               "`git fetch --unshallow`")
    return H.Git(root)


@pytest.fixture(scope="module")
def committed():
    found = R.findings()
    assert set(found.get("claims", {})) == set(CLAIM_IDS), "repro registration --write"
    return found


def test_the_committed_findings_are_what_the_history_says(history, committed):
    """Each claim's first rule, first data, the rule it had when the data came (its code, as
    the findings keep it to run) and the commits after the data are those of the history."""
    from repro.results import repo_root

    defs = yaml.safe_load((repo_root() / H.CLAIMS_PATH).read_text())
    for claim in CLAIM_IDS:
        f = committed["claims"][claim]
        events = H.history(history, claim)
        data = H.first_data(history, list(defs[claim]["rule"]["studies"]), repo_root(),
                            defs[claim]["rule"].get("data"))
        assert f["first_data"] == data, claim
        if data is None:  # registered before any record: nothing came after its data
            assert f["first_rule"]["commit"] == events[0].commit[:7], claim
            assert f["changes"] == [] and f["rule_at_data"] is None, claim
            continue
        t0 = pd.Timestamp(data["date"])
        before = [e for e in events if pd.Timestamp(e.date) < t0]
        assert f["first_rule"]["commit"] == events[0].commit[:7], claim
        assert [c["commit"] for c in f["changes"]] == [
            e.commit[:7] for e in events if pd.Timestamp(e.date) >= t0], claim
        if before:
            at = before[-1].after
            assert f["rule_at_data"]["commit"] == at.commit[:7], claim
            assert committed["rules"][f["rule_at_data"]["version"]] == json.loads(
                json.dumps(at.to_dict())), claim
        else:
            assert f["rule_at_data"] is None, claim


def test_every_change_after_the_data_is_proven_on_the_committed_inputs(history, committed):
    """The restatement test: a change said to decide the same does so on today's inputs (the
    committed verdict inputs), a change said to decide differently on them does; each rule
    version loaded from git. (The generated tables: the slow test below.)"""
    checked = 0
    for claim in CLAIM_IDS:
        f = committed["claims"][claim]
        events = {e.commit[:7]: e for e in H.history(history, claim)}
        inputs = R.read_inputs(claim)
        records = R.records_of(f["studies"])
        for c in f["changes"]:
            e = events[c["commit"]]
            if e.before is None:
                continue
            got, how = H.prove(e.before.to_dict(), e.after.to_dict(), inputs, records,
                               examples=0)
            if c["how"].startswith("on today's inputs") or c["decides"] == "the same":
                assert got == ("the same" if c["decides"] == "the same" else c["decides"]), (
                    claim, c, how)
                checked += 1
    assert checked > 100


@pytest.mark.slow
def test_every_change_after_the_data_is_proven_on_generated_tables_too(history, committed):
    """The whole proof of every change after the data: the committed findings are what
    `repro registration --write` gives (today's inputs, then the tables Hypothesis generates
    around the thresholds, derandomized)."""
    from repro.results import repo_root

    assert H.build(repo_root(), examples=committed["examples"]) == committed


def test_a_planted_rule_change_is_found_differently(history):
    """A8's rule with its 'no divergence: inconclusive' branch taken out decides otherwise on
    the committed inputs: what the working-tree check below reports."""
    head = H.version(history, history.run("rev-parse", "HEAD").strip(), "A8").to_dict()
    planted = json.loads(json.dumps(head))
    for f in planted["code"]["files"].values():
        f["code"] = [s.replace("(not (diverged.get(x, 0) or diverged.get(ablation, 0)))",
                               "False") for s in f["code"]]
    assert planted != head
    got, how = H.prove(head, planted, R.read_inputs("A8"), examples=0)
    assert got == "differently" and "inconclusive before, contradicted after" in how


def test_no_rule_changed_in_the_working_tree_without_its_registration(history):
    """A claim's rule as the working tree has it decides as HEAD's on the committed inputs
    and on tables generated around the thresholds; a rule that decides otherwise must be
    committed and its change registered (`repro registration --write`)."""
    head = history.run("rev-parse", "HEAD").strip()
    for claim in CLAIM_IDS:
        old = H.version(history, head, claim)
        new = H.version(history, H.WORKTREE, claim)
        if old.fingerprint() == new.fingerprint():
            continue
        got, how = H.prove(old.to_dict(), new.to_dict(), R.read_inputs(claim),
                           R.records_of(list(new.rule["rule"]["studies"])), examples=20)
        assert got == "the same", (f"{claim}'s rule in the working tree decides otherwise "
                                   f"than at HEAD ({how}): commit it and run `repro "
                                   "registration --write`, which discloses the change")


@pytest.mark.parametrize("claim", CLAIM_IDS)
def test_the_verdict_under_the_first_rule_is_shown_where_it_differs(claim, committed):
    """Today's verdict (from the committed inputs) and the one under the rule the claim had
    when its data came: where they differ, the key number, the caveat and the ledger's row
    show both."""
    from repro.claims import ledger
    from repro.claims import verdicts

    args, kw = R.read_inputs(claim)
    v = R.judged(getattr(verdicts, claim.lower()), claim, *args,
                 records=R.records_of(committed["claims"][claim]["studies"]), **kw)
    reg = v.numbers["registration"]
    first = reg.get("first_rule_verdict")
    if committed["claims"][claim]["preregistered"]:
        assert reg == {"preregistered": 1}
        return
    assert reg["preregistered"] == 0 and reg["changed"]
    if first not in (v.verdict, "none"):
        said = f"{first} under its rule before the data"
        assert said in v.key_number and v.caveat.startswith(said)
        row = ledger.markdown_row({
            "claim": claim, "statement": "s", "verdict": v.verdict, "key_number": v.key_number,
            "hardware": v.hardware, "emulated": v.emulated, "stale": False, "stale_note": "",
            "caveat": v.caveat, "decides": v.decides, "numbers": v.numbers, "notebook": ""})
        assert f"**{v.verdict}** {ledger.CHANGED} first rule: {first}" in row
    else:
        assert "under its rule before the data" not in v.key_number


def test_a8_was_contradicted_and_b1_reproduced_under_their_first_rules(committed):
    """What the history shows: A8's rule became 'inconclusive where no seed diverged' after its
    data (17a3b9b); B1's became 'partly until native FP4 is measured' (3cc04ba)."""
    rows = {r["claim"]: r for r in R.summary(committed)}
    assert rows["A8"]["verdict under first rule"] == "contradicted"
    assert rows["A8"]["changed after data"].startswith("yes, 17a3b9b")
    assert rows["B1"]["verdict under first rule"] == "reproduced"
    assert rows["B1"]["changed after data"].startswith("yes, 3cc04ba")


def test_the_committed_inputs_give_the_committed_verdicts(committed):
    """The inputs written as data decode to what the verdict saw: today's rule on them gives
    each committed verdict's word."""
    from repro.claims import verdicts
    from repro.results import repo_root

    for claim in CLAIM_IDS:
        args, kw = R.read_inputs(claim)
        fn = getattr(verdicts, claim.lower())
        v = R.judged(fn, claim, *args, records=R.records_of(committed["claims"][claim]
                                                            ["studies"]), **kw)
        path = repo_root() / "verdicts" / f"{claim}.json"
        assert v.verdict == json.loads(path.read_text())["verdict"], claim


def test_the_first_rules_notebook_code_has_its_inputs(committed):
    """Every rule kept to run (the rules claims had when their data came) that is a
    notebook's own code finds every variable it reads among the inputs named for it."""
    checked = 0
    for version in committed["rules"].values():
        code = version["code"]
        if code["kind"] != "notebook":
            continue
        args, kw = R.read_inputs(version["claim"])
        names = rulecode.NOTEBOOK_INPUTS[code["path"]](version["claim"], args, kw, None)
        assert H.free_names(code) <= set(names), (version["claim"], H.free_names(code))
        checked += 1
    assert checked >= 5


def test_the_registration_command_prints_the_table(committed):
    out = subprocess.run([sys.executable, "-m", "repro.cli", "registration"],
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0].startswith("| claim | first rule |")
    assert len([x for x in out.splitlines() if x.startswith("| A")]) == 12
    # a claim without records yet has a row too (its first data: none yet)
    assert [x.split(" | ")[0] for x in out.splitlines() if "none yet" in x] == ["| C1", "| C2"]


SHALLOW_JUDGE = """
import json, sys
from repro.claims import registration, verdicts
from repro.verdict import definitions
for claim in definitions():
    args, kw = registration.read_inputs(claim)
    studies = definitions()[claim]["rule"]["studies"]
    v = registration.judged(getattr(verdicts, claim.lower()), claim, *args,
                            records=registration.records_of(studies), **kw)
    print(json.dumps(v.to_dict(), sort_keys=True))
"""


@pytest.mark.slow
def test_a_shallow_clone_writes_byte_identical_verdicts(tmp_path, committed):
    """`git clone --depth 1` (CI's usual clone) has no history: its notebooks read the
    committed registration findings and write the verdicts a full clone writes, byte for byte
    (here: every claim's verdict from its committed inputs, as the notebooks compute it)."""
    import os

    from repro.results import repo_root

    root = repo_root()
    clones = {}
    for name, depth in (("shallow", ["--depth", "1"]), ("full", [])):
        clones[name] = tmp_path / name
        git(tmp_path, "clone", "-q", *depth, f"file://{root}", str(clones[name]))
    assert not H.available(clones["shallow"]) and H.available(clones["full"])
    out = {}
    for name, clone in clones.items():
        env = {**os.environ, "PYTHONPATH": str(clone), "REPRO_ROOT": str(clone),
               "REPRO_VERDICTS": str(tmp_path / f"v-{name}"), "JAX_PLATFORMS": "cpu"}
        run = subprocess.run([sys.executable, "-c", SHALLOW_JUDGE], cwd=clone, env=env,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        out[name] = run.stdout
        inputs = sorted((tmp_path / f"v-{name}" / "inputs").glob("*.json"))
        assert [p.read_bytes() for p in inputs] == [
            (clone / "verdicts" / "inputs" / p.name).read_bytes() for p in inputs]
    assert out["shallow"] == out["full"] and len(out["full"].splitlines()) == len(CLAIM_IDS)
    assert "registration not checked" not in out["shallow"]


def test_a_rule_naming_its_data_files_has_their_first_commit_as_its_first_data(tmp_path):
    """A claim about one hardware and recipe (C1, C2) names its record files (``data``):
    older records of its studies (other recipes, other hardware) are not its data; a rule
    without ``data`` counts every record of its studies."""
    from repro.claims import rulehistory as H

    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    commit(root, "old records", "2026-01-01T00:00:00+00:00",
           {"results/h200/xs/bf16.json": "[]"})
    g = H.Git(root)
    assert H.first_data(g, ["xs"], root, ["results/tpu/xs/*int8*"]) is None  # none of its own
    commit(root, "int8 records", "2026-01-03T00:00:00+00:00",
           {"results/tpu/xs/w4096_int8.json": "[]"})
    own = H.first_data(g, ["xs"], root, ["results/tpu/xs/*int8*"])
    assert own["date"].startswith("2026-01-03")
    assert H.first_data(g, ["xs"], root)["date"].startswith("2026-01-01")
