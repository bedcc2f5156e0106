"""The repository root: REPRO_ROOT where set, else the checkout at or above the working
directory (two checkouts sharing one virtual environment each keep their own records), else
the checkout the package was imported from."""

from pathlib import Path

import pytest

from repro import checkout, results

PACKAGE_CHECKOUT = Path(checkout.__file__).resolve().parent.parent


def a_checkout(folder: Path) -> Path:
    (folder / "repro").mkdir(parents=True)
    (folder / "repro" / "__init__.py").write_text("")
    (folder / "params.yaml").write_text("profile: smoke\n")
    (folder / "results").mkdir()
    return folder


def test_the_root_is_the_checkout_around_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("REPRO_ROOT", raising=False)
    second = a_checkout(tmp_path / "second")
    (second / "notebooks" / "deep").mkdir(parents=True)
    monkeypatch.chdir(second / "notebooks" / "deep")
    assert checkout.repo_root() == second
    assert results.results_dir() == second / "results"
    # A folder with params.yaml but no repro package is not a checkout: the search goes on up.
    (second / "notebooks" / "params.yaml").write_text("profile: smoke\n")
    assert checkout.repo_root() == second


def test_repro_root_overrides_the_working_directory(tmp_path, monkeypatch):
    second, third = a_checkout(tmp_path / "second"), a_checkout(tmp_path / "third")
    monkeypatch.chdir(second)
    monkeypatch.setenv("REPRO_ROOT", str(third))
    assert checkout.repo_root() == third


def test_outside_any_checkout_the_package_checkout_is_the_root(tmp_path, monkeypatch):
    monkeypatch.delenv("REPRO_ROOT", raising=False)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert (PACKAGE_CHECKOUT / "dvc.yaml").exists()
    assert checkout.repo_root() == PACKAGE_CHECKOUT


def test_outside_any_checkout_an_installed_package_names_the_folder(tmp_path, monkeypatch):
    """Installed from a wheel (no checkout around the package) and run in a folder that is
    no checkout: refused, naming the folder, not read as a project with nothing measured."""
    monkeypatch.delenv("REPRO_ROOT", raising=False)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.setattr(checkout, "__file__", str(tmp_path / "site-packages" / "repro" / "x.py"))
    with pytest.raises(ValueError) as e:
        checkout.repo_root()
    assert str(e.value) == (f"no checkout of this repository at or above {tmp_path / 'elsewhere'}"
                            " (a folder with params.yaml, results/ and the repro package): run "
                            "repro in one, or set REPRO_ROOT to one")


@pytest.mark.parametrize("has", [(), ("params.yaml",), ("results",), ("notebooks",)])
def test_a_repro_root_that_is_not_a_checkout_is_refused_naming_it(tmp_path, monkeypatch, has):
    for name in has:
        (tmp_path / name).mkdir() if "." not in name else (tmp_path / name).write_text("x: 1\n")
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    missing = ", ".join(n for n in ("params.yaml", "results/") if n.rstrip("/") not in has)
    with pytest.raises(ValueError) as e:
        checkout.repo_root()
    assert str(e.value) == (f"REPRO_ROOT={tmp_path}: not a checkout of this repository (no "
                            f"{missing} in it)")
