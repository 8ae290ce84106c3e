import datetime as dt
import stat

import pytest

from libs.security.certs import CertificateError, issue, new_ca, verify_leaf
from libs.security.identity import Identity, IdentityError, Role
from libs.security.store import CertStore, CertStoreError

NOW = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)


def test_leaf_carries_role_and_name_and_verifies_against_its_ca():
    ca = new_ca(NOW)
    leaf = issue(ca, Identity(Role.STAGE, "stage-1"), NOW)
    assert verify_leaf(leaf.cert_pem, ca.cert_pem, NOW) == Identity(Role.STAGE, "stage-1")


def test_leaf_from_another_ca_is_untrusted():
    leaf = issue(new_ca(NOW), Identity(Role.OPERATOR, "admin"), NOW)
    with pytest.raises(CertificateError) as caught:
        verify_leaf(leaf.cert_pem, new_ca(NOW).cert_pem, NOW)
    assert caught.value.reason == "UNTRUSTED_CERTIFICATE"


def test_expired_leaf_is_refused():
    ca = new_ca(NOW)
    leaf = issue(ca, Identity(Role.CLIENT, "app"), NOW, validity=dt.timedelta(days=1))
    with pytest.raises(CertificateError) as caught:
        verify_leaf(leaf.cert_pem, ca.cert_pem, NOW + dt.timedelta(days=2))
    assert caught.value.reason == "CERTIFICATE_EXPIRED"


@pytest.mark.parametrize("text", ["root/x", "operator/", "operator/Bad Name", "nobody"])
def test_identity_parse_rejects_malformed(text):
    with pytest.raises(IdentityError):
        Identity.parse(text)


def test_store_files_are_private_and_rotation_changes_the_key(tmp_path):
    store = CertStore(tmp_path)
    store.init(NOW)
    who = Identity(Role.SERVICE, "planner")
    first = store.issue(who, NOW, hosts=("localhost", "10.0.0.7"))
    for path in (store.ca_cert, store.ca_key, first.paths.cert, first.paths.key):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.root.stat().st_mode) == 0o700
    old_key = first.paths.key.read_bytes()
    store.rotate([who], NOW)
    assert first.paths.key.read_bytes() != old_key
    assert set(store.hosts_of(who)) == {"localhost", "10.0.0.7"}
    assert store.identities() == [who]


def test_store_refuses_to_replace_a_ca(tmp_path):
    store = CertStore(tmp_path)
    store.init(NOW)
    with pytest.raises(CertStoreError):
        store.init(NOW)


def test_ca_rotation_is_refused_out_of_order_and_retirement_waits_for_every_leaf(tmp_path):
    store = CertStore(tmp_path)
    store.init(NOW)
    operator = Identity(Role.OPERATOR, "admin")
    old_leaf = store.ensure(operator, NOW).cert.read_bytes()
    with pytest.raises(CertStoreError):
        store.retire_ca()  # nothing to retire
    store.rotate_ca(NOW)
    with pytest.raises(CertStoreError):
        store.rotate_ca(NOW)  # one rotation at a time
    bundle = store.ca_cert.read_bytes()
    assert bundle.count(b"BEGIN CERTIFICATE") == 2
    assert verify_leaf(old_leaf, bundle, NOW) == operator
    with pytest.raises(CertStoreError, match="operator/admin"):
        store.retire_ca()
    new_leaf = store.rotate([operator], NOW)[0].paths.cert.read_bytes()
    store.retire_ca()
    trusted = store.ca_cert.read_bytes()
    assert trusted.count(b"BEGIN CERTIFICATE") == 1 and trusted == store.ca_signing.read_bytes()
    assert verify_leaf(new_leaf, trusted, NOW) == operator
    with pytest.raises(CertificateError) as caught:
        verify_leaf(old_leaf, trusted, NOW)
    assert caught.value.reason == "UNTRUSTED_CERTIFICATE"
