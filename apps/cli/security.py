"""`fornax certs init|issue|rotate|list|rotate-ca|retire-ca` and `fornax audit show|verify`."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import sys
from pathlib import Path

from libs.security.audit import read_entries, verify_file
from libs.security.certs import DEFAULT_HOSTS
from libs.security.identity import Identity, IdentityError
from libs.security.store import CertStore, CertStoreError
from libs.service.fleet_state import read_fleet


def register(commands, benches) -> None:
    certs = commands.add_parser("certs", help="the fleet CA and per-service, per-host certificates")
    verbs = certs.add_subparsers(dest="verb", metavar="VERB", required=True)
    init = verbs.add_parser("init", help="create the fleet CA under <state dir>/certs")
    init.add_argument(
        "--force", action="store_true", help="replace an existing CA (every certificate must be reissued)"
    )
    issue = verbs.add_parser("issue", help="issue a certificate for ROLE/NAME (operator, client, stage, service)")
    issue.add_argument("identity", help="e.g. operator/alice, client/web, stage/stage-0, service/planner")
    issue.add_argument("--host", action="append", default=[], help="DNS name or IP it serves on (repeatable)")
    issue.add_argument("--days", type=int, default=90)
    rotate = verbs.add_parser("rotate", help="new keys and certificates; running services pick them up")
    rotate.add_argument("identity", nargs="*", help="ROLE/NAME to rotate (default: every issued one)")
    verbs.add_parser("list", help="identities issued under this state dir")
    rotate_ca = verbs.add_parser(
        "rotate-ca", help="a new fleet CA; services trust old and new until `retire-ca` (then run `rotate`)")
    retire_ca = verbs.add_parser("retire-ca", help="stop trusting the previous fleet CA (after `rotate`)")
    retire_ca.add_argument("--force", action="store_true",
                           help="retire even though some certificates are still from the old CA")
    for parser in (init, issue, rotate, verbs.choices["list"], rotate_ca, retire_ca):
        parser.add_argument("--state-dir", default=".fornax")
    certs.set_defaults(func=cmd_certs)

    audit = commands.add_parser("audit", help="the services' hash-chained audit logs")
    audit_verbs = audit.add_subparsers(dest="verb", metavar="VERB", required=True)
    for name, text in (("show", "print the entries"), ("verify", "check every chain; exit 1 on a broken one")):
        parser = audit_verbs.add_parser(name, help=text)
        parser.add_argument("files", nargs="*", help="log files (default: <state dir>/audit/*.jsonl)")
        parser.add_argument("--state-dir", default=".fornax")
        parser.add_argument("--json", action="store_true")
    audit.set_defaults(func=cmd_audit)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _fail(message: str) -> int:
    print(f"fornax: {message}", file=sys.stderr)
    return 2


def cmd_certs(args: argparse.Namespace) -> int:
    store = CertStore(args.state_dir)
    try:
        if args.verb == "init":
            print(f"fleet CA: {store.init(_now(), force=args.force)}")
        elif args.verb == "issue":
            issued = store.issue(Identity.parse(args.identity), _now(), tuple(args.host) or DEFAULT_HOSTS,
                                 dt.timedelta(days=args.days))
            print(f"{issued.identity.uri}\n  cert {issued.paths.cert}\n  key  {issued.paths.key}\n"
                  f"  valid until {issued.not_after.isoformat()}")
        elif args.verb == "rotate":
            return _rotate(store, args)
        elif args.verb == "rotate-ca":
            print(f"new fleet CA signs from now on; {store.rotate_ca(_now())} trusts the old and the new CA")
            _reload_services(args.state_dir)
            print("next: `fornax certs rotate` to reissue every certificate, then `fornax certs retire-ca`")
        elif args.verb == "retire-ca":
            print(f"{store.retire_ca(force=args.force)} trusts the new fleet CA only")
            _reload_services(args.state_dir)
        else:
            for identity in store.identities():
                print(f"{identity}\t{', '.join(store.hosts_of(identity))}")
    except (CertStoreError, IdentityError) as exc:
        return _fail(str(exc))
    return 0


def _rotate(store: CertStore, args: argparse.Namespace) -> int:
    targets = [Identity.parse(text) for text in args.identity] or store.identities()
    for issued in store.rotate(targets, _now()):
        print(f"rotated {issued.identity} (valid until {issued.not_after.isoformat()})")
    _reload_services(args.state_dir)
    return 0


def _reload_services(state_dir: str) -> None:
    # Services notice the new files at their next handshake; SIGHUP makes it explicit.
    state = read_fleet(state_dir)
    for service in state.services if state else ():
        try:
            os.kill(service.pid, signal.SIGHUP)
        except ProcessLookupError:
            continue
        print(f"asked {service.name} (pid {service.pid}) to reload")


def _audit_files(args: argparse.Namespace) -> list[Path]:
    if args.files:
        return [Path(f) for f in args.files]
    return sorted((Path(args.state_dir) / "audit").glob("*.jsonl"))


def cmd_audit(args: argparse.Namespace) -> int:
    files = _audit_files(args)
    if not files:
        return _fail(f"no audit logs under {Path(args.state_dir) / 'audit'}")
    if args.verb == "show":
        for path in files:
            for entry in read_entries(path):
                line = entry.to_line() if args.json else (
                    f"{entry.seq:>5} {entry.event.time} {entry.event.caller:<24} "
                    f"{entry.event.rpc.rsplit('/', 1)[-1]:<20} {entry.event.result}  [{path.stem}]")
                print(line)
        return 0
    broken = 0
    for path in files:
        result = verify_file(path)
        report = {"file": str(path), "ok": result.ok, "entries": result.entries, "head": result.head,
                  "problem": result.problem.value if result.problem else None, "line": result.line,
                  "detail": result.detail}
        broken += not result.ok
        print(json.dumps(report) if args.json else (
            f"{'OK    ' if result.ok else 'BROKEN'} {path}: {result.entries} entries, head {result.head[:16]}"
            + ("" if result.ok or result.problem is None
               else f"; {result.problem.value} at line {result.line} ({result.detail})")))
    return 1 if broken else 0

