"""A fuzz receiver with the enum lookup that once crashed on JSON lists and objects, to
prove `fornax fuzz fnx2` reports such a defect as crashes. Test use only."""

import asyncio
import sys

from apps.fnx2.fuzz_receiver import main
from libs.fnx2.wire import codec


def _unguarded_member(enum_type, value):
    return enum_type(value) if value in enum_type._value2member_map_ else None  # unhashable: TypeError


if __name__ == "__main__":
    codec.member = _unguarded_member
    asyncio.run(main(sys.argv[1:]))
