import datetime as dt

from libs.security.identity import Identity, Role
from libs.security.store import CertStore
from libs.security.tls import ReloadingServerCredentials

NOW = dt.datetime.now(dt.UTC)
PLANNER = Identity(Role.SERVICE, "planner")


def _store(tmp_path) -> CertStore:
    store = CertStore(tmp_path)
    store.init(NOW)
    store.issue(PLANNER, NOW)
    return store


def test_unchanged_files_keep_the_configuration_and_sighup_forces_a_reload(tmp_path):
    credentials = ReloadingServerCredentials(_store(tmp_path).paths_for(PLANNER))
    assert credentials._fetch() is None
    credentials.request_reload()
    assert credentials._fetch() is not None and credentials.reloads == 1
    assert credentials._fetch() is None


def test_rotated_files_are_loaded_once(tmp_path):
    store = _store(tmp_path)
    credentials = ReloadingServerCredentials(store.paths_for(PLANNER))
    store.rotate([PLANNER], NOW)
    assert credentials._fetch() is not None
    assert credentials._fetch() is None and credentials.reloads == 1


def test_a_half_written_rotation_keeps_the_last_good_certificate(tmp_path):
    store = _store(tmp_path)
    paths = store.paths_for(PLANNER)
    credentials = ReloadingServerCredentials(paths)
    old_cert = paths.cert.read_bytes()
    store.rotate([PLANNER], NOW)
    paths.cert.write_bytes(old_cert)  # new key, old certificate: a mismatched pair
    assert credentials._fetch() is None and credentials.reloads == 0
