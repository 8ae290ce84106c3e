import os

import pytest

from libs.security.paths import confine, parse_roots
from libs.service.errors import PermissionDenied


def test_paths_under_a_root_pass_and_others_are_refused(tmp_path):
    root = tmp_path / "store"
    (root / "a").mkdir(parents=True)
    roots = parse_roots(f"{root}{os.pathsep}")
    assert confine(str(root / "a"), roots, "out_dir") == (root / "a").resolve()
    for outside in (str(tmp_path), str(root / ".." / "elsewhere"), "/etc/passwd"):
        with pytest.raises(PermissionDenied) as caught:
            confine(outside, roots, "out_dir")
        assert (caught.value.reason, caught.value.field) == ("PATH_OUTSIDE_ROOTS", "out_dir")


def test_a_symlink_out_of_the_root_is_refused(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    (root / "escape").symlink_to(tmp_path)
    with pytest.raises(PermissionDenied):
        confine(str(root / "escape" / "x"), (root.resolve(),), "artifact_dir")


def test_no_roots_refuses_everything(tmp_path):
    with pytest.raises(PermissionDenied):
        confine(str(tmp_path), (), "checkpoint_dir")
