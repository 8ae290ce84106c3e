"""Fleet trust: identities and certificates, TLS material, role authorization, the audit
chain, evidence signatures and path confinement. Pure where possible; file I/O is in
`store`, `audit_log` and `tls`."""
