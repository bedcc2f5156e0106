"""The repository root: REPRO_ROOT where set, else the checkout at or above the working
directory (two checkouts sharing one virtual environment each keep their own records), else
the checkout the package was imported from."""

from pathlib import Path

from repro import results

PACKAGE_CHECKOUT = Path(results.__file__).resolve().parent.parent


def checkout(folder: Path) -> Path:
    (folder / "repro").mkdir(parents=True)
    (folder / "repro" / "__init__.py").write_text("")
    (folder / "params.yaml").write_text("profile: smoke\n")
    return folder


def test_the_root_is_the_checkout_around_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("REPRO_ROOT", raising=False)
    second = checkout(tmp_path / "second")
    (second / "notebooks" / "deep").mkdir(parents=True)
    monkeypatch.chdir(second / "notebooks" / "deep")
    assert results.repo_root() == second
    assert results.results_dir() == second / "results"
    # A folder with params.yaml but no repro package is not a checkout: the search goes on up.
    (second / "notebooks" / "params.yaml").write_text("profile: smoke\n")
    assert results.repo_root() == second


def test_repro_root_overrides_the_working_directory(tmp_path, monkeypatch):
    second, third = checkout(tmp_path / "second"), checkout(tmp_path / "third")
    monkeypatch.chdir(second)
    monkeypatch.setenv("REPRO_ROOT", str(third))
    assert results.repo_root() == third


def test_outside_any_checkout_the_package_checkout_is_the_root(tmp_path, monkeypatch):
    monkeypatch.delenv("REPRO_ROOT", raising=False)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    expected = PACKAGE_CHECKOUT if (PACKAGE_CHECKOUT / "dvc.yaml").exists() else \
        tmp_path / "elsewhere"
    assert results.repo_root() == expected
